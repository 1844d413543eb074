// Package version holds crisp's version: a semantic version (semver.org), because the
// CRI's Version.runtime_version must be one, and kubelet shows it as crisp://<version>.
package version

import (
	// For the release in VERSION, the one place a release bump edits.
	_ "embed"
	"runtime/debug"
	"strings"
)

// release is the contents of the VERSION file next to this one: the release this tree
// is, or works toward. The Makefile reads the same file.
//
//go:embed VERSION
var release string

// Release is the release this tree is, or works toward (e.g. "0.1.0"), without
// pre-release or build metadata.
var Release = strings.TrimSpace(release)

// Version is crisp's version. The Makefile sets it at link time (-X) to Release on the
// release's tag v<Release> in a clean tree, and to <Release>-dev+<commit>[.dirty]
// otherwise. A plain `go build` leaves it empty and init derives it from the build
// information the go command stamps in (see FromBuildInfo).
var Version string

// Name is the runtime name reported over the CRI and the shim's -info.
const Name = "crisp"

func init() {
	// Only builds outside the Makefile pay for reading the build info: the shim's
	// binary runs this in every container init and exec too.
	if Version == "" {
		bi, _ := debug.ReadBuildInfo()
		Version = FromBuildInfo(Release, bi)
	}
}

// FromBuildInfo returns the version of a binary built from release without the
// Makefile: release itself when the go command stamped the clean tag v<release> as the
// main module's version, else <release>-dev, with +<commit>[.dirty] as build metadata
// when the go command recorded the commit (it does for `go build` in a git checkout,
// not for `go test` or -buildvcs=false). bi may be nil.
func FromBuildInfo(release string, bi *debug.BuildInfo) string {
	if bi == nil {
		return release + "-dev"
	}
	if bi.Main.Version == "v"+release {
		return release
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if !isHex(rev) {
		return release + "-dev"
	}
	v := release + "-dev+" + rev[:min(len(rev), commitLen)]
	if dirty {
		v += ".dirty"
	}
	return v
}

// commitLen is how many hex digits of the commit a version carries; the Makefile's
// `git rev-parse --short=12` gives the same (git lengthens it only if ambiguous).
const commitLen = 12

// isHex reports whether s is a non-empty run of hex digits, the only commit ids a
// semver build identifier can carry as is.
func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
