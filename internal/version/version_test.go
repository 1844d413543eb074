package version

import (
	"github.com/crisp-runtime/crisp/internal/testutil"

	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// semver is the regular expression semver.org suggests for a valid version. Tests only:
// the shim's binary must not link regexp (cmd/shim-runc TestLeanImportGraph).
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

func TestReleaseIsSemverWithoutSuffixes(t *testing.T) {
	if !semver.MatchString(Release) || strings.ContainsAny(Release, "-+") {
		t.Fatalf("version/VERSION holds %q, want a plain MAJOR.MINOR.PATCH like 0.1.0", Release)
	}
}

func TestVersionIsSemver(t *testing.T) {
	if !semver.MatchString(Version) {
		t.Fatalf("Version = %q, not a semantic version", Version)
	}
	if !strings.HasPrefix(Version, Release) {
		t.Fatalf("Version = %q, want it to start with the release %q", Version, Release)
	}
}

func TestFromBuildInfo(t *testing.T) {
	const rev = "4a6c72a1b2c3d4e5f60718293a4b5c6d7e8f9012"
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "0.1.0-dev"},
		{"no vcs (go test, -buildvcs=false)", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "0.1.0-dev"},
		{"clean commit", &debug.BuildInfo{Settings: vcs(rev, "false")}, "0.1.0-dev+4a6c72a1b2c3"},
		{"dirty commit", &debug.BuildInfo{Settings: vcs(rev, "true")}, "0.1.0-dev+4a6c72a1b2c3.dirty"},
		{"clean release tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}, Settings: vcs(rev, "false")}, "0.1.0"},
		{"dirty release tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0+dirty"}, Settings: vcs(rev, "true")}, "0.1.0-dev+4a6c72a1b2c3.dirty"},
		{"another release's tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.9"}, Settings: vcs(rev, "false")}, "0.1.0-dev+4a6c72a1b2c3"},
		{"pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261125104620-4a6c72a1b2c3"}, Settings: vcs(rev, "false")}, "0.1.0-dev+4a6c72a1b2c3"},
		{"revision not hex", &debug.BuildInfo{Settings: vcs("not/a+rev", "false")}, "0.1.0-dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := FromBuildInfo("0.1.0", tc.bi)
			if got != tc.want {
				t.Errorf("FromBuildInfo = %q, want %q", got, tc.want)
			}
			if !semver.MatchString(got) {
				t.Errorf("FromBuildInfo = %q, not a semantic version", got)
			}
		})
	}
}

// TestMakefileVersion runs the Makefile's VERSION computation (make print-version) in
// scratch git repositories holding a copy of the Makefile and internal/version/VERSION: on the
// release tag, off it, with uncommitted changes and outside git.
func TestMakefileVersion(t *testing.T) {
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	makefile, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	commit := regexp.MustCompile(`^0\.1\.0-dev\+[0-9a-f]{12}$`)
	dirty := regexp.MustCompile(`^0\.1\.0-dev\+[0-9a-f]{12}\.dirty$`)
	for _, tc := range []struct {
		name  string
		setup [][]string // git commands after `git init` and a first commit; "!edit" changes a file
		noGit bool       // no repository at all (a source tarball)
		want  *regexp.Regexp
	}{
		{name: "outside git", noGit: true, want: regexp.MustCompile(`^0\.1\.0-dev$`)},
		{name: "untagged commit", want: commit},
		{name: "release tag", setup: [][]string{{"tag", "v0.1.0"}}, want: regexp.MustCompile(`^0\.1\.0$`)},
		{name: "annotated release tag", setup: [][]string{{"tag", "-a", "-m", "release", "v0.1.0"}}, want: regexp.MustCompile(`^0\.1\.0$`)},
		{name: "another release's tag", setup: [][]string{{"tag", "v0.0.9"}}, want: commit},
		{name: "commit after the release tag", setup: [][]string{{"tag", "v0.1.0"}, {"commit", "--allow-empty", "-q", "-m", "next"}}, want: commit},
		{name: "uncommitted change", setup: [][]string{{"!edit"}}, want: dirty},
		{name: "release tag with uncommitted change", setup: [][]string{{"tag", "v0.1.0"}, {"!edit"}}, want: dirty},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "Makefile"), string(makefile))
			writeFile(t, filepath.Join(dir, "internal", "version", "VERSION"), "0.1.0\n")
			// Keep git from finding a repository above the scratch dir.
			env := append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir,
				"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
			run := func(name string, args ...string) string {
				t.Helper()
				cmd := exec.Command(name, args...)
				cmd.Dir, cmd.Env = dir, env
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
				}
				return strings.TrimSpace(string(out))
			}
			if !tc.noGit {
				run("git", "init", "-q")
				run("git", "add", ".")
				run("git", "commit", "-q", "-m", "first")
				for _, args := range tc.setup {
					if args[0] == "!edit" {
						writeFile(t, filepath.Join(dir, "Makefile"), string(makefile)+"# a local change\n")
						continue
					}
					run("git", args...)
				}
			}
			got := run("make", "-s", "--no-print-directory", "print-version")
			if !tc.want.MatchString(got) {
				t.Fatalf("make print-version = %q, want %v", got, tc.want)
			}
			if !semver.MatchString(got) {
				t.Fatalf("make print-version = %q, not a semantic version", got)
			}
		})
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
