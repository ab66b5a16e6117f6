// Package httpguard owns the rules every HTTP server of an ingest-worker
// process applies to a request before anything else:
//
//   - Hosts: the allow-list of Host header values (INGEST_HTTP_ALLOWED_HOSTS).
//     A request for any other name is refused with 421 before routing,
//     authentication or any handler: a page on an attacker's domain whose
//     name the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin
//     for the browser, so only the Host header tells it apart.
//   - CrossSite: a state-changing request (any method but GET, HEAD,
//     OPTIONS) that a browser marks as sent by another site
//     (Sec-Fetch-Site other than same-origin or none) or whose Origin is not
//     the request's own. Clients that send neither header (curl, scripts,
//     other services) pass. Package api answers it with a JSON 403 and
//     package ui with a 403 page, with or without a token.
package httpguard
