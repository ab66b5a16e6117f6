// Package promreg owns the one rule every component follows when it
// registers its metrics on an injected prometheus.Registerer: a nil
// registerer registers nothing, and a collector equal to one registered
// before (another instance of the component in the same process) is shared,
// not an error.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns the collector to use: c, or the
// equal one registered before. A nil reg registers nothing and returns c.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("register metrics: %w", err)
	}
	return c, nil
}
