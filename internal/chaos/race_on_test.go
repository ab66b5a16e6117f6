//go:build reliability && race

package chaos

// raceEnabled: the suite runs with -race, so the workers are built with it.
const raceEnabled = true
