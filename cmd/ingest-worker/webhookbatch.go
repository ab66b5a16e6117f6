package main

import (
	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/webhook"
)

// webhookHandler returns what registers the built-in webhook handler for
// every kind: one POST per task, or, with INGEST_WEBHOOK_BATCH_MAX > 1,
// one POST per batch of up to that many tasks of a kind.
func (a *app) webhookHandler() (func(*ingest.Service) error, error) {
	cfg := webhook.Config{URL: a.cfg.WebhookURL, Timeout: a.cfg.WebhookTimeout, MaxResultBytes: a.cfg.MaxResultBytes,
		IdleConns: webhook.IdleConnsFor(a.cfg.WorkerConcurrency)}
	if a.cfg.WebhookBatchMax <= 1 {
		h, err := webhook.NewResult(cfg)
		if err != nil {
			return nil, err
		}
		return func(svc *ingest.Service) error { svc.HandleDefaultResult(h); return nil }, nil
	}
	h, err := webhook.NewBatch(cfg)
	if err != nil {
		return nil, err
	}
	opts := ingest.BatchOptions{Max: a.cfg.WebhookBatchMax, Wait: a.cfg.WebhookBatchWait}
	return func(svc *ingest.Service) error { return svc.HandleDefaultBatch(h, opts) }, nil
}
