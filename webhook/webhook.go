package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
)

// Defaults for Config.
const (
	DefaultTimeout       = 30 * time.Second
	DefaultMaxRetryAfter = time.Hour
	DefaultUserAgent     = "ingest-worker"
	// DefaultIdleConns is how many idle connections to the URL's host the
	// handler's own client keeps for reuse, at least (IdleConnsFor): a
	// busy worker should not open a TCP (and TLS) connection per request
	// (net/http's default keeps 2).
	DefaultIdleConns = 256
)

// Config configures the webhook handler. Zero fields take the Default*
// values.
type Config struct {
	// URL receives one POST per task run; required, http or https.
	URL string
	// Timeout bounds one request, from connecting to reading the response;
	// the task's context may end it sooner.
	Timeout time.Duration
	// MaxRetryAfter caps the delay a Retry-After header can ask for.
	MaxRetryAfter time.Duration
	// UserAgent is sent with every request.
	UserAgent string
	// MaxResultBytes bounds the JSON body of a 2xx response that becomes
	// the task's result (NewResult); 0: task.DefaultMaxResultBytes. A
	// larger one fails the run.
	MaxResultBytes int
	// IdleConns is how many idle connections to the URL's host the
	// handler's own client keeps (0: DefaultIdleConns): as many as the
	// worker runs handlers at once (IdleConnsFor), or the requests beyond
	// it each open a connection and close it after. Not used with a
	// Client that has a Transport of its own.
	IdleConns int
	// Client sends the requests; nil means a client of its own, which
	// keeps up to IdleConns idle connections to the host. Its redirect
	// policy is replaced: redirects are never followed.
	Client *http.Client
}

// IdleConnsFor returns the idle connections to keep for a worker that
// runs up to handlers handlers at once: that many, and DefaultIdleConns
// at least.
func IdleConnsFor(handlers int) int { return max(handlers, DefaultIdleConns) }

// Transport returns the transport of the handler's own client:
// net/http's default one, keeping up to idle idle connections to the
// URL's host (Config.IdleConns).
func Transport(idle int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = idle
	t.MaxIdleConnsPerHost = idle
	return t
}

// Request is the JSON body POSTed for each task run.
type Request struct {
	TaskID  uuid.UUID       `json:"task_id"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload"`
	Attempt int             `json:"attempt"`
	// Dependencies holds the results of the task's dependencies, keyed by
	// their ids (null for one that returned none); absent for a task
	// without dependencies.
	Dependencies map[uuid.UUID]json.RawMessage `json:"dependencies,omitempty"`
}

// requestOf is the request body element of run t: the one place that
// says what a receiver is told about a run, alone or in a batch.
func requestOf(t ingest.Task) Request {
	return Request{TaskID: t.ID, Kind: t.Kind, Payload: t.Payload, Attempt: t.Attempt, Dependencies: t.Dependencies}
}

// IdempotencyKeyHeader carries the task id.
const IdempotencyKeyHeader = "Idempotency-Key"

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c Config) WithDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.UserAgent = cmp.Or(c.UserAgent, DefaultUserAgent)
	c.MaxResultBytes = cmp.Or(c.MaxResultBytes, task.DefaultMaxResultBytes)
	c.IdleConns = cmp.Or(c.IdleConns, DefaultIdleConns)
	return c
}

// Validate checks the configuration, zero fields taking their defaults,
// and names the bad field: "webhook: URL: must be http or https, got
// ftp://x/y" (passwords of URLs masked).
func (c Config) Validate() error {
	c = c.WithDefaults()
	bad := func(setting, format string, args ...any) error {
		return configerr.New("webhook", nil, setting, format, args...)
	}
	if c.URL == "" {
		return bad("URL", "is required")
	}
	u, err := url.Parse(c.URL)
	switch {
	case err != nil:
		return bad("URL", "is not a valid URL, got %s", redact.DSN(c.URL))
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("URL", "scheme must be http or https, got %s", redact.DSN(c.URL))
	case u.Host == "":
		return bad("URL", "has no host, got %s", redact.DSN(c.URL))
	case c.Timeout < 0:
		return bad("Timeout", "must be at least 0s, got %s", c.Timeout)
	case c.MaxRetryAfter < 0:
		return bad("MaxRetryAfter", "must be at least 0s, got %s", c.MaxRetryAfter)
	case !task.ResultBytesRange.Contains(int64(c.MaxResultBytes)):
		return bad("MaxResultBytes", "must be %s, got %d", task.ResultBytesRange.Text(), c.MaxResultBytes)
	case c.IdleConns < 0:
		return bad("IdleConns", "must be at least 0, got %d", c.IdleConns)
	}
	return nil
}

type handler struct {
	cfg   Config
	url   string // for requests
	shown string // for errors: redacted
	// traced sends through the tracing transport, plain without (do).
	traced, plain *http.Client
}

// New returns a handler that POSTs each task run to cfg.URL and keeps no
// result (NewResult's handler without its result).
func New(cfg Config) (ingest.Handler, error) {
	h, err := NewResult(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, t ingest.Task) error {
		_, err := h(ctx, t)
		return err
	}, nil
}

// NewResult returns a handler that POSTs each task run to cfg.URL; the
// JSON body of a 2xx response is the task's result (see the package
// documentation).
func NewResult(cfg Config) (ingest.ResultHandler, error) {
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	return h.handle, nil
}

// newHandler validates cfg and returns the handler of its URL, with its
// client.
func newHandler(cfg Config) (*handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client
		client = &c
	}
	if client.Transport == nil {
		client.Transport = Transport(cfg.IdleConns)
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	traced := *client
	traced.Transport = otelhttp.NewTransport(client.Transport, otelhttp.WithPropagators(tracing.Propagator()))
	return &handler{cfg: cfg, url: cfg.URL, shown: redact.DSN(cfg.URL), traced: &traced, plain: client}, nil
}

// do sends req. When its context holds a recording span (tracing is on),
// through the tracing transport: a client span per POST, a child of the
// attempt's, whose traceparent the request carries (docs/ARCHITECTURE.md
// §7.4). Otherwise the request carries the context's trace context as it
// is, without that transport, whose span and metric attributes, made for
// every request, cost more than the request's own round trip when nothing
// records them.
func (h *handler) do(req *http.Request) (*http.Response, error) {
	if trace.SpanFromContext(req.Context()).IsRecording() {
		return h.traced.Do(req)
	}
	tracing.Propagator().Inject(req.Context(), propagation.HeaderCarrier(req.Header))
	return h.plain.Do(req)
}

// maxErrorBody is how much of a failed response's body goes into the error.
const maxErrorBody = 256

func (h *handler) handle(ctx context.Context, t ingest.Task) (json.RawMessage, error) {
	body, err := json.Marshal(requestOf(t))
	if err != nil {
		return nil, ingest.Permanent(fmt.Errorf("webhook: encode task %s: %w", t.ID, err))
	}
	rctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, ingest.Permanent(fmt.Errorf("webhook: POST %s: %v", h.shown, err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", h.cfg.UserAgent)
	req.Header.Set(IdempotencyKeyHeader, t.ID.String())

	resp, err := h.do(req)
	if err != nil {
		return nil, h.transportError(ctx, rctx, err)
	}
	defer resp.Body.Close()
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		return h.result(ctx, rctx, resp)
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
	err = fmt.Errorf("webhook: POST %s: %s%s", h.shown, resp.Status, bodySuffix(snippet))
	switch {
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return nil, ingest.RetryAfter(min(d, h.cfg.MaxRetryAfter), err)
		}
		return nil, err
	case code >= 400:
		return nil, ingest.Permanent(err)
	default: // 1xx, 3xx: not what a webhook should answer; maybe transient
		return nil, err
	}
}

// result reads the body of a 2xx response: a JSON one (Content-Type
// application/json or +json) of at most MaxResultBytes is the result;
// another body is no result and is drained; a larger or invalid JSON body
// fails the run.
func (h *handler) result(parent, rctx context.Context, resp *http.Response) (json.RawMessage, error) {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" && !strings.HasSuffix(mt, "+json") {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(h.cfg.MaxResultBytes)+1))
	switch {
	case err != nil:
		return nil, h.transportError(parent, rctx, err)
	case len(b) > h.cfg.MaxResultBytes:
		return nil, fmt.Errorf("webhook: POST %s: %s: the JSON response body (the task's result) is larger than %d bytes (INGEST_RESULT_MAX_BYTES)", h.shown, resp.Status, h.cfg.MaxResultBytes)
	case len(bytes.TrimSpace(b)) > 0 && !json.Valid(b):
		return nil, fmt.Errorf("webhook: POST %s: %s: the response body is %s but not valid JSON%s", h.shown, resp.Status, mt, bodySuffix(b[:min(len(b), maxErrorBody)]))
	}
	return b, nil
}

// transportError describes a failed request without the URL's secrets.
func (h *handler) transportError(parent, rctx context.Context, err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	switch {
	case parent.Err() != nil:
		// The worker is shutting down or the task's own timeout passed.
		return fmt.Errorf("webhook: POST %s: %w", h.shown, context.Cause(parent))
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("webhook: POST %s: no response within %s", h.shown, h.cfg.Timeout)
	}
	return fmt.Errorf("webhook: POST %s: %v", h.shown, err)
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0, false
		}
		if secs > int64(365*24*time.Hour/time.Second) {
			secs = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		if d := at.Sub(now); d > 0 {
			return d, true
		}
	}
	return 0, false
}

func bodySuffix(b []byte) string {
	s := strings.TrimSpace(strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, string(bytes.ToValidUTF8(b, []byte("?")))))
	if s == "" {
		return ""
	}
	return ": " + s
}
