package ui

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sessions live in PostgreSQL (table ingest_ui_session, migration 00014),
// not only in the cookie: a logout deletes the row, so the cookie it ended
// is refused from then on, by every process that serves the dashboard on
// the same database (several `ui` or `run` processes behind a load balancer
// need no sticky sessions), and a process restart keeps them. The cookie is
// "expiry.id.HMAC(key, expiry.id)" with the key derived from the token: a
// forged or foreign cookie is refused without a query, and a new token
// ends every session. A page costs one primary-key lookup more.

// createSessionSQL stores a new session and deletes the expired ones.
const createSessionSQL = `
WITH expired AS (DELETE FROM ingest_ui_session WHERE expires_at < now())
INSERT INTO ingest_ui_session (id_hash, expires_at) VALUES ($1, $2)`

// sessionLiveSQL reports whether a session exists and has not expired.
const sessionLiveSQL = `SELECT EXISTS (SELECT 1 FROM ingest_ui_session WHERE id_hash = $1 AND expires_at > now())`

// endSessionSQL ends a session.
const endSessionSQL = `DELETE FROM ingest_ui_session WHERE id_hash = $1`

// newSession stores a session that expires at exp and returns its cookie
// value.
func (h *Handler) newSession(ctx context.Context, exp time.Time) (string, error) {
	id := randomToken()
	if _, err := h.cfg.DB.Exec(ctx, createSessionSQL, idHash(id), exp); err != nil {
		return "", err
	}
	body := strconv.FormatInt(exp.Unix(), 10) + "." + id
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(body))
	return body + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

func idHash(id string) []byte {
	sum := sha256.Sum256([]byte(id))
	return sum[:]
}

// sessionID returns the id of r's session cookie when the cookie is one
// this server signed and has not expired; "" otherwise. It does not ask
// the database.
func (h *Handler) sessionID(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(c.Value, '.')
	if i < 0 {
		return ""
	}
	body, sig := c.Value[:i], c.Value[i+1:]
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return ""
	}
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(body))
	if !hmac.Equal(got, m.Sum(nil)) {
		return ""
	}
	expS, id, _ := strings.Cut(body, ".")
	exp, err := strconv.ParseInt(expS, 10, 64)
	if err != nil || time.Now().Unix() >= exp || id == "" {
		return ""
	}
	return id
}

// authed reports whether r may see the dashboard: no token configured,
// or a valid session cookie whose session has not ended. err: the session
// could not be looked up (PostgreSQL unavailable).
func (h *Handler) authed(r *http.Request) (bool, error) {
	if h.cfg.Token == "" {
		return true, nil
	}
	id := h.sessionID(r)
	if id == "" {
		return false, nil
	}
	var live bool
	if err := h.cfg.DB.QueryRow(r.Context(), sessionLiveSQL, idHash(id)).Scan(&live); err != nil {
		return false, err
	}
	return live, nil
}

// endSession ends r's session, if it has one.
func (h *Handler) endSession(r *http.Request) error {
	id := h.sessionID(r)
	if id == "" {
		return nil
	}
	_, err := h.cfg.DB.Exec(r.Context(), endSessionSQL, idHash(id))
	return err
}
