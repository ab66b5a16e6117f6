// Package pguuid teaches pgx to encode and scan github.com/google/uuid's
// UUID as the 16 bytes it is.
//
// Without it pgx treats a uuid.UUID as a driver.Valuer and an sql.Scanner:
// each one it encodes becomes a 36-character string that fails pgx's
// binary plan (an error built with fmt.Errorf) and is then parsed back,
// and each one it scans is formatted as text and parsed again. Encoding
// the arrays of task ids of the hot statements that way took a fifth of
// the worker's CPU in a benchmark.
package pguuid

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Register replaces m's uuid and uuid[] types with ones whose codec
// encodes uuid.UUID and scans into *uuid.UUID through pgx's own [16]byte
// plans; every other Go type is handled as before.
func Register(m *pgtype.Map) {
	t := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: codec{}}
	m.RegisterType(t)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: t}})
}

// AfterConnect registers the types on a new connection: a
// pgxpool.Config's AfterConnect.
func AfterConnect(_ context.Context, c *pgx.Conn) error {
	Register(c.TypeMap())
	return nil
}

type codec struct{ pgtype.UUIDCodec }

func (c codec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok {
		if next := m.PlanEncode(oid, format, [16]byte{}); next != nil {
			return encodePlan{next: next}
		}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

func (c codec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok {
		if next := m.PlanScan(oid, format, new([16]byte)); next != nil {
			return scanPlan{next: next}
		}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

type encodePlan struct{ next pgtype.EncodePlan }

func (p encodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode([16]byte(value.(uuid.UUID)), buf)
}

type scanPlan struct{ next pgtype.ScanPlan }

func (p scanPlan) Scan(src []byte, target any) error {
	return p.next.Scan(src, (*[16]byte)(target.(*uuid.UUID)))
}
