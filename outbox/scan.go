package outbox

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Where a relay's claim and its due timer begin reading the claim index.
//
// outbox_event_claim_idx holds, besides the unsent rows, an entry for
// every row that was unsent once and has been SENT (or DEAD) since, until
// vacuum removes it. Those entries sort first: a row is sent in the order
// it fell due. While a transaction older than their change stays open
// (idle in transaction, a long REPEATABLE READ reader), vacuum can remove
// none of them, and no scan can mark them dead, so a scan from the front
// of the index reads every one, and its heap tuple, before the first live
// row: with 400 rows sent a second, after a few minutes of such a hold each
// claim read some 100,000 of them (2 ms became 14 ms) and so did the due
// timer's query.
//
// So a relay remembers where the live rows began (scanFrom): after a claim
// that locked rows, the earliest next_retry_at among them, less
// lateCommitSlack. Its next claims and due-timer queries read the index
// from there (next_retry_at >= the bound): a few entries of the rows sent
// in the last second instead of all those sent since the hold began.
//
// A row the bound leaves out is an unsent row due before it. Such a row
// was not there, or not free, when the claim that set the bound read the
// index:
//   - a row committed late: its next_retry_at is the now() of its
//     transaction (or a due time in the past), and the transaction took
//     longer than the slack to commit;
//   - a row locked by another relay's pass that then failed or died with
//     its process;
//   - a direct claim that expired (its writer died before publishing);
//   - a row another relay left claimed as an orphan.
// None is lost or kept long. Late rows, the common case, are found by id
// (late.go): every PublishInterval the relay reads the rows created since
// its previous such read, on the primary key, and lowers the bound to the
// earliest unsent due one among them. The rest are found by a claim that
// reads from the front of the index: one every frontEvery (a minute, or
// PublishInterval when that is longer), the first claim of a relay, and
// the next claim after a pass of this relay failed, lost its rows or took
// over a stalled pass, or after a read by id could not tell. Every relay,
// in this process or another, keeps a bound of its own; SKIP LOCKED keeps
// their batches apart as before.

// lateCommitSlack is how far before the earliest row a claim locked the
// next claim begins: a row whose transaction commits within this long of
// its next_retry_at (the now() of that transaction, for a row due now) is
// found by the next claim, not only by the periodic scan from the front.
const lateCommitSlack = time.Second

// frontEvery is how often a relay's claim reads the claim index from the
// front, at least: what finds the rows of a pass that died with its
// process, and expired direct claims (see above). Longer PublishIntervals
// replace it.
const frontEvery = time.Minute

// fromStart is the bound of a scan from the front of the claim index.
var fromStart = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}

// scanFrom is a relay's bound on the claim index (see above). It is safe
// for concurrent use by the relay's passes.
type scanFrom struct {
	every time.Duration    // how often a claim reads from the front (frontEvery)
	now   func() time.Time // the relay's clock, for every

	mu sync.Mutex
	// at is the bound; invalid: read from the front.
	at pgtype.Timestamptz
	// fullAt is when a claim last read from the front.
	fullAt time.Time
	// resets counts the calls of reset and lower: a claim that began
	// before one does not set the bound (found).
	resets uint64
}

// claim returns the bound of a claim, and the token to give found with
// what it locked: fromStart when none is known or the last claim from the
// front was every ago or more (this claim is then the one from the front
// of its period), else the bound.
func (s *scanFrom) claim() (bound pgtype.Timestamptz, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !s.at.Valid || s.fullAt.IsZero() || now.Sub(s.fullAt) >= s.every || now.Before(s.fullAt) {
		s.fullAt = now
		return fromStart, s.resets
	}
	return s.at, s.resets
}

// due returns the bound of the due timer's query: the claims' bound, or
// fromStart when none is known.
func (s *scanFrom) due() pgtype.Timestamptz {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.Valid {
		return fromStart
	}
	return s.at
}

// found records first, the earliest next_retry_at among the rows a claim
// locked (token: claim's): later claims read from lateCommitSlack before
// it. A claim that began before the last reset or lower changes nothing:
// the rows freed or found then may sort before first, and it did not see
// them.
func (s *scanFrom) found(first pgtype.Timestamptz, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token != s.resets {
		return
	}
	if !first.Valid || first.InfinityModifier != pgtype.Finite {
		s.at = pgtype.Timestamptz{}
		return
	}
	s.at = pgtype.Timestamptz{Time: first.Time.Add(-lateCommitSlack), Valid: true}
}

// reset makes the next claim and due-timer query read from the front: at
// the relay's poll, and when rows may be free again before the bound (a
// pass failed or lost its rows, or a stalled pass was taken over).
func (s *scanFrom) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = pgtype.Timestamptz{}
	s.resets++
}

// lower makes the next claims and due-timer queries read from
// lateCommitSlack before due, when that is before the bound: due is the
// earliest next_retry_at of the late rows a read by id found.
func (s *scanFrom) lower(due pgtype.Timestamptz) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.Valid || !due.Valid {
		return
	}
	if due.InfinityModifier != pgtype.Finite {
		s.at = pgtype.Timestamptz{}
	} else if b := due.Time.Add(-lateCommitSlack); b.Before(s.at.Time) {
		s.at = pgtype.Timestamptz{Time: b, Valid: true}
	} else {
		return
	}
	s.resets++
}
