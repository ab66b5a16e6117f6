package bench

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// MaxSinkBody bounds the body of one request to a Sink: a task of
// MaxPayloadBytes with room to spare.
const MaxSinkBody = 2 * MaxPayloadBytes

// Sink is the in-process HTTP receiver of the webhook workload
// (Options.Handler = HandlerWebhook, and bench/river's --handler webhook):
// a net/http server on 127.0.0.1 that reads each POSTed body, a
// webhook.Request, and answers 204 at once, or 500 to the first attempt of
// the tasks that FailsFirstAttempt chooses, so that a fail rate fails the
// same tasks as with the no-op handler.
//
// The body's task_id is the task's UUID (its 16 bytes are hashed, as the
// no-op handler hashes ingest.Task.ID) or, for River's jobs, the decimal
// job id (its 8 big-endian bytes are hashed, as bench/river's no-op worker
// does). A body without a task_id of either form or without an attempt is
// answered 400, which the webhook handler treats as a permanent failure: a
// run with a malformed body does not finish.
type Sink struct {
	srv      *http.Server
	url      string
	failRate float64
	requests atomic.Int64
	failed   atomic.Int64
	conns    atomic.Int64
	done     chan struct{}
	serveErr error
}

// sinkRequest is the part of a webhook.Request the sink reads.
type sinkRequest struct {
	TaskID  string `json:"task_id"`
	Attempt int    `json:"attempt"`
}

// StartSink starts a Sink on a free port of 127.0.0.1 that fails the first
// attempt of a fraction failRate of the tasks (0: none).
func StartSink(failRate float64) (*Sink, error) {
	if !(failRate >= 0 && failRate < 1) {
		return nil, fmt.Errorf("sink: fail rate must be in [0, 1), got %v", failRate)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sink: listen: %w", err)
	}
	s := &Sink{url: "http://" + ln.Addr().String() + "/hook", failRate: failRate, done: make(chan struct{})}
	s.srv = &http.Server{
		Handler: s,
		// Keep-alive is on (net/http's default): a client that keeps its
		// connections idle reuses them; idle ones close after IdleTimeout,
		// as long as http.Transport's default IdleConnTimeout.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       90 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.serveErr = err
		}
	}()
	return s, nil
}

// URL is where to POST.
func (s *Sink) URL() string { return s.url }

// Requests is the number of requests received so far.
func (s *Sink) Requests() int64 { return s.requests.Load() }

// Failed is the number of requests answered 500 so far.
func (s *Sink) Failed() int64 { return s.failed.Load() }

// Connections is the number of connections accepted so far: about
// Requests when the clients do not reuse their connections.
func (s *Sink) Connections() int64 { return s.conns.Load() }

// Close stops the server and closes its connections.
func (s *Sink) Close() error {
	err := s.srv.Close()
	<-s.done
	return errors.Join(err, s.serveErr)
}

// ServeHTTP answers one request.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSinkBody))
	if err != nil {
		http.Error(w, "read the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req sinkRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "decode the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	id, ok := SinkTaskKey(req.TaskID)
	if !ok || req.Attempt < 1 {
		http.Error(w, fmt.Sprintf("want a task_id (UUID or decimal job id) and an attempt >= 1, got %q and %d", req.TaskID, req.Attempt), http.StatusBadRequest)
		return
	}
	if req.Attempt == 1 && s.failRate > 0 && FailsFirstAttempt(id, s.failRate) {
		s.failed.Add(1)
		w.WriteHeader(http.StatusInternalServerError) // no Retry-After: the worker's own backoff applies
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SinkTaskKey returns the bytes that FailsFirstAttempt hashes for the
// task_id of a request to a Sink: a decimal River job id gives its 8
// big-endian bytes, a UUID its 16 bytes.
func SinkTaskKey(taskID string) ([]byte, bool) {
	if n, err := strconv.ParseInt(taskID, 10, 64); err == nil {
		return binary.BigEndian.AppendUint64(nil, uint64(n)), true
	}
	if u, err := uuid.Parse(taskID); err == nil {
		return u[:], true
	}
	return nil, false
}
