// Package httpguard owns the rules every HTTP server of an ingest-worker
// process applies to a request before anything else:
//
//   - CrossSite: a state-changing request (any method but GET, HEAD,
//     OPTIONS) that a browser marks as sent by another site
//     (Sec-Fetch-Site other than same-origin or none) or whose Origin is not
//     the request's own. Clients that send neither header (curl, scripts,
//     other services) pass. Package api answers it with a JSON 403 and
//     package ui with a 403 page, with or without a token.
package httpguard
