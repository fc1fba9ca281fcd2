package cli

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuildVersion(t *testing.T) {
	t.Parallel()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	vcs := &debug.BuildInfo{
		GoVersion: "go1.99.1",
		Main:      debug.Module{Path: "lock.dev/lockd", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name                   string
		bi                     *debug.BuildInfo
		stampV, stampC, stampM string
		want                   versionInfo
	}{
		{"no build info", nil, "", "", "",
			versionInfo{"(devel)", "unknown", "unknown", runtime.Version(), platform}},
		{"checkout built with -buildvcs=false", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}}, "", "", "",
			versionInfo{"(devel)", "unknown", "unknown", "go1.99.1", platform}},
		{"vcs settings", vcs, "", "", "",
			versionInfo{"v1.2.3", "0123456789abcdef0123456789abcdef01234567", "true", "go1.99.1", platform}},
		{"stamped wins", vcs, "v2.0.0", "fedcba", "false",
			versionInfo{"v2.0.0", "fedcba", "false", "go1.99.1", platform}},
		{"partly stamped", vcs, "v2.0.0", "", "",
			versionInfo{"v2.0.0", "0123456789abcdef0123456789abcdef01234567", "true", "go1.99.1", platform}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildVersion(tc.bi, tc.stampV, tc.stampC, tc.stampM); got != tc.want {
				t.Errorf("buildVersion = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestVersionCommand runs lockd version in-process (a test binary: no
// stamped values, module version "(devel)" or empty).
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	res := lockd(t, nil, "version")
	if res.code != 0 {
		t.Fatalf("lockd version: %v", res)
	}
	for _, want := range []string{"version:  ", "commit:   ", "modified: ", "go:       " + runtime.Version() + "\n",
		"platform: " + runtime.GOOS + "/" + runtime.GOARCH + "\n"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("lockd version stdout lacks %q:\n%s", want, res.stdout)
		}
	}

	res = lockd(t, nil, "version", "-o", "json")
	if res.code != 0 {
		t.Fatalf("lockd version -o json: %v", res)
	}
	var v versionInfo
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("lockd version -o json: %v in %q", err, res.stdout)
	}
	if v.Go != runtime.Version() || v.Version == "" || v.Commit == "" || v.Modified == "" {
		t.Errorf("lockd version -o json = %+v", v)
	}

	if res := lockd(t, nil, "version", "extra"); res.code != ExitUsage {
		t.Errorf("lockd version extra: %v, want exit %d", res, ExitUsage)
	}
}
