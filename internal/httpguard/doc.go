// Package httpguard owns the rules every HTTP server of an ingest-worker
// process applies to a request before anything else, and the one rule of
// which failures mean "a server this process needs cannot be reached":
//
//   - Hosts: the allow-list of Host header values (ForListen: the loopback
//     names, the listen address or the machine's names, and
//     INGEST_HTTP_ALLOWED_HOSTS).
//     A request for any other name is refused with 421 before routing,
//     authentication or any handler: a page on an attacker's domain whose
//     name the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin
//     for the browser, so only the Host header tells it apart.
//   - CrossSite: a state-changing request (any method but GET, HEAD,
//     OPTIONS) that a browser marks as sent by another site
//     (Sec-Fetch-Site other than same-origin or none) or, without that
//     header, whose Origin is not the request's own. Clients that send neither header (curl, scripts,
//     other services) pass. package api answers it with a JSON 403 and
//     package ui with a 403 page, with or without a token.
//   - Unavailable: PostgreSQL or Redis cannot be reached (refused or failed
//     connections, a closed pool, a server shutting down or still loading).
//     The API answers such a failure 503 with Retry-After (RetryAfter), the
//     dashboard a "database unavailable" page; neither shows the error's
//     text, which may name the database user, host and port.
package httpguard
