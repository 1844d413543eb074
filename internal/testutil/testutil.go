// Package testutil holds what tests of several packages share: the root-skip helper
// and the way to find the repository's files from a test. It is imported by tests
// only, never by a shipped binary.
package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// RequiresRoot skips t unless it runs as root. why says what the test needs root for
// (namespaces, cgroups, mounts, dpkg), so that a skipped run tells its reader what a
// root run would have checked.
func RequiresRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// RepoRoot returns the repository's top directory, found from this source file's
// place (internal/testutil) so that it works from any package's test binary and
// working directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}
