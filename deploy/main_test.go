package deploy_test

import (
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
