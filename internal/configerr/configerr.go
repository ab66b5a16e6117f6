// Package configerr owns the one form of a configuration error of the
// module's packages: "<package>: <Setting>: <what is wrong>", for example
// "reclaim: MinIdle: must be at least 1ms, got 0s". Setting is the Config
// field as a library user writes it, dotted for a nested one
// ("Elector.TTL", "Backoff.Max"), so that the binary can tell which of its
// settings an error is about (errors.As to *Error).
package configerr

import (
	"errors"
	"fmt"
)

// Error is a bad configuration field.
type Error struct {
	// Package is the package whose Config the field is in ("reclaim").
	Package string
	// Setting is the field ("MinIdle", "Elector.TTL").
	Setting string
	// Problem says what is wrong with the value, and the value.
	Problem string
	// kind is the package's sentinel, if it has one (maintenance.ErrConfig).
	kind error
}

func (e *Error) Error() string { return e.Package + ": " + e.Setting + ": " + e.Problem }

// Unwrap returns the package's sentinel, so that errors.Is(err,
// pkg.ErrConfig) holds.
func (e *Error) Unwrap() error { return e.kind }

// New returns the error of setting of package pkg; kind is the package's
// sentinel error, or nil.
func New(pkg string, kind error, setting, format string, args ...any) error {
	return &Error{Package: pkg, Setting: setting, Problem: fmt.Sprintf(format, args...), kind: kind}
}

// Within returns err, the error of a nested configuration (a backoff
// policy's), as the error of field prefix of package pkg's Config: the
// setting "Max" of the policy in field "Backoff" becomes "Backoff.Max".
// An err not of this package becomes the problem of setting prefix.
func Within(pkg string, kind error, prefix string, err error) error {
	if err == nil {
		return nil
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return &Error{Package: pkg, Setting: prefix + "." + e.Setting, Problem: e.Problem, kind: kind}
	}
	return &Error{Package: pkg, Setting: prefix, Problem: err.Error(), kind: kind}
}
