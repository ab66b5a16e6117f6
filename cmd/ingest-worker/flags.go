package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/ingest-worker/ingest/task"
)

// rangeValue is a whole-number flag whose range is a task.Range (owned by
// the package of the field): a value out of it, a fraction or a number no
// integer holds is refused when the flags are parsed, as a usage error
// (exit 2) naming the flag and the range, before it could be narrowed.
type rangeValue[T int | int64] struct {
	r task.Range
	v *T
}

func (v *rangeValue[T]) Set(s string) error {
	n, ferr := v.r.Parse(s)
	if ferr != nil {
		return fmt.Errorf("must be a whole number %s", v.r.Text())
	}
	*v.v = T(n)
	return nil
}

func (v *rangeValue[T]) String() string { return strconv.FormatInt(int64(*v.v), 10) }
func (v *rangeValue[T]) Type() string   { return "int" }

// rangeFlag registers the flag name (shorthand short, "" for none) on fs:
// a whole number in r stored in p, def by default; the usage ends with the
// range.
func rangeFlag[T int | int64](fs *pflag.FlagSet, p *T, name, short string, r task.Range, def T, usage string) {
	*p = def
	fs.VarP(&rangeValue[T]{r: r, v: p}, name, short, fmt.Sprintf("%s (%d..%d)", usage, r.Min, r.Max))
}

// flagOfField maps a task.FieldError's field to the flag of a command that
// sets it; a field without a flag keeps its name.
func flagOfField(field string, flags map[string]string) string {
	if f, ok := flags[field]; ok {
		return f
	}
	return field
}
