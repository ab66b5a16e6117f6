// Package defaults owns the one rule every component's configuration
// follows: a field left at its zero value takes the component's default.
package defaults

// Set stores def in *v when *v is the zero value of its type.
func Set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
