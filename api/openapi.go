package api

import (
	"crypto/sha256"
	_ "embed" // the OpenAPI document
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
)

// openAPIDoc is the OpenAPI 3.1 document of every route New registers
// (openapi.json in this package; its tests hold it to the route table,
// lint it and validate live answers against it).
//
//go:embed openapi.json
var openAPIDoc []byte

// openAPIETag is the strong validator of openAPIDoc: it changes exactly
// when the document does.
var openAPIETag = func() string {
	sum := sha256.Sum256(openAPIDoc)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}()

// OpenAPI returns the OpenAPI 3.1 document of the HTTP API, the one
// GET /v1/openapi.json serves.
func OpenAPI() []byte { return slices.Clone(openAPIDoc) }

// serveOpenAPI answers GET /v1/openapi.json. It needs no token: the
// document holds no secret, and tools fetch it before they hold one. The
// answer may be cached but is revalidated (no-cache) with its ETag, so a
// client sees a new document as soon as the server runs a new binary.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("ETag", openAPIETag)
	h.Set("Cache-Control", "no-cache")
	if etagMatches(r.Header.Get("If-None-Match"), openAPIETag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
}

// etagMatches reports whether an If-None-Match header names etag (or is
// "*"); a weak form of it (W/"...") matches too (RFC 9110 §13.1.2).
func etagMatches(header, etag string) bool {
	for tag := range strings.SplitSeq(header, ",") {
		tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
		if tag == "*" || tag == etag {
			return true
		}
	}
	return false
}
