package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Stamped by release builds (make release):
//
//	go build -ldflags "-X lock.dev/lockd/internal/cli.version=v1.2.3
//	  -X lock.dev/lockd/internal/cli.commit=<sha> -X lock.dev/lockd/internal/cli.modified=false"
//
// Unset, lockd version falls back to the build information the Go
// toolchain records: the module version (set by go install MODULE@VERSION)
// and the VCS revision and modified flag (set unless -buildvcs=false).
var version, commit, modified string

// versionInfo is what lockd version prints.
type versionInfo struct {
	Version  string `json:"version"`  // module version, "(devel)" for a build from a checkout
	Commit   string `json:"commit"`   // VCS revision, "unknown" when not recorded
	Modified string `json:"modified"` // "true" when built from a work tree with changes, "false", or "unknown"
	Go       string `json:"go"`       // toolchain that built the binary
	Platform string `json:"platform"` // GOOS/GOARCH
}

// buildVersion combines the stamped variables with the toolchain's build
// information (bi may be nil: ReadBuildInfo failed). A stamped value wins.
func buildVersion(bi *debug.BuildInfo, stampedVersion, stampedCommit, stampedModified string) versionInfo {
	v := versionInfo{
		Version:  "(devel)",
		Commit:   "unknown",
		Modified: "unknown",
		Go:       runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		if bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			v.Go = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				v.Modified = s.Value
			}
		}
	}
	stamp := func(dst *string, stamped string) {
		if stamped != "" {
			*dst = stamped
		}
	}
	stamp(&v.Version, stampedVersion)
	stamp(&v.Commit, stampedCommit)
	stamp(&v.Modified, stampedModified)
	return v
}

func newVersionCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print lockd's version, the commit it was built from and the Go version",
		Args:  exactArgs(0, "no arguments"),
	}
	out := addOutputFlag(cmd)
	cmd.RunE = func(*cobra.Command, []string) error {
		if err := out.check(); err != nil {
			return err
		}
		bi, _ := debug.ReadBuildInfo()
		v := buildVersion(bi, version, commit, modified)
		if out.json() {
			return writeJSON(e.stdout, v)
		}
		_, err := fmt.Fprintf(e.stdout, "version:  %s\ncommit:   %s\nmodified: %s\ngo:       %s\nplatform: %s\n",
			v.Version, v.Commit, v.Modified, v.Go, v.Platform)
		return err
	}
	return cmd
}
