package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/bench"
)

// benchSDKRows is the smoke check of `lockd bench`'s SDK rows (issue 25):
// the distinct scenario, tiny, over the embedded backend (lockd's server
// in this process), with the Python SDK (sdk/python) and the TypeScript SDK
// (tsDir, built by npm ci) each driven by its bench worker process; every
// SDK has its pairs/s, p50 and p99 rows at both SDK concurrencies, with a
// positive figure for it and for the Go SDK and their ratio, in the JSON
// report.
func benchSDKRows(t *testing.T, ctx context.Context, tsDir string) {
	py, err := bench.PythonSDK(filepath.Join("..", "..", "sdk", "python"), python)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := bench.TypeScriptSDK(tsDir, "node")
	if err != nil {
		t.Fatal(err)
	}
	cfg := bench.Config{Backend: bench.BackendEmbedded, DataDir: t.TempDir(), Duration: 100 * time.Millisecond, Rounds: 1,
		Scenarios: []string{"distinct"}, DistinctConcurrency: []int{1}, SDKs: []bench.SDKWorker{py, ts}, SDKConcurrency: []int{1, 4}}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("bench.Run: %v", err)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Settings struct {
			SDKs           []string `json:"sdks"`
			SDKConcurrency []int    `json:"sdk_concurrency"`
		} `json:"settings"`
		Rows []struct {
			Scenario    string   `json:"scenario"`
			Concurrency int      `json:"concurrency"`
			Metric      string   `json:"metric"`
			SDK         string   `json:"sdk"`
			Lockd       *float64 `json:"lockd"`
			Baseline    string   `json:"baseline"`
			Raw         *float64 `json:"raw"`
			Ratio       *float64 `json:"ratio"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("report: %v\n%s", err, buf.String())
	}
	if strings.Join(got.Settings.SDKs, ",") != "python,typescript" || len(got.Settings.SDKConcurrency) != 2 {
		t.Errorf("settings: sdks %v at %v; want python,typescript at [1 4]", got.Settings.SDKs, got.Settings.SDKConcurrency)
	}
	for _, sdk := range []string{bench.SDKPython, bench.SDKTypeScript} {
		for _, c := range []int{1, 4} {
			for _, m := range []string{bench.MetricPairsPerSec, bench.MetricP50, bench.MetricP99} {
				found := false
				for _, r := range got.Rows {
					if r.SDK != sdk || r.Concurrency != c || r.Metric != m {
						continue
					}
					found = true
					pos := func(v *float64) bool { return v != nil && *v > 0 }
					if r.Scenario != "distinct" || r.Baseline != "go-sdk" || !pos(r.Lockd) || !pos(r.Raw) || !pos(r.Ratio) {
						t.Errorf("%s c=%d %s: %+v; want distinct against go-sdk with both figures and their ratio > 0", sdk, c, m, r)
					}
					if m == bench.MetricPairsPerSec {
						t.Logf("%s c=%d: %.0f pairs/s, go-sdk %.0f, ratio %.2f", sdk, c, *r.Lockd, *r.Raw, *r.Ratio)
					}
				}
				if !found {
					t.Errorf("no row %s c=%d %s", sdk, c, m)
				}
			}
		}
	}
}
