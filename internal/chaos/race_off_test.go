//go:build reliability && !race

package chaos

const raceEnabled = false
