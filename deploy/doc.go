// Package deploy holds what runs next to the workers, and its tests: the
// Prometheus configuration and alert rules (prometheus/), the Grafana
// dashboard and its provisioning (grafana/). docs/OPERATIONS.md explains
// them and has a runbook per alert; docker-compose.yml starts them.
//
// The tests check that the alert rules pass promtool (syntax and the unit
// tests of prometheus/alerts_test.yml, which show each alert firing and
// silent), that each alert links a runbook that exists, that the compose
// file, the Prometheus configuration and the Grafana provisioning agree on
// paths, hosts and ports, and that every PromQL expression of the dashboard
// and the rules names only metrics, labels and label values that a running
// `ingest-worker run` exports (whose /metrics also passes promtool check
// metrics). promtool comes with the Debian package prometheus; without it
// the tests fail.
package deploy
