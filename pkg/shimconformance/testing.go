package shimconformance

import (
	"context"
	"testing"
)

// RunT runs the suite and reports each capability as a subtest of t: a failure is a
// t.Error, an unsupported capability a t.Skip. It returns the report.
func RunT(t *testing.T, cfg Config) *Report {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = t.Logf
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("shim conformance: %v", err)
	}
	for _, res := range rep.Results {
		t.Run(res.Capability, func(t *testing.T) {
			switch res.Status {
			case Fail:
				t.Error(res.Detail)
			case Unsupported:
				t.Skip(res.Detail)
			default:
				if res.Detail != "" {
					t.Log(res.Detail)
				}
			}
		})
	}
	return rep
}
