package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// What TestE2EContainerdCritest (through containerd on this host) and TestNodeCritest
// (against the installed crisp in the node VM) share: running critest, reading its
// JSON report, the outcome of each spec.

// critestSpec is one spec of ginkgo's JSON report (the fields the test reads).
type critestSpec struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	LeafNodeType            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
	// excluded is the reason of the --ginkgo.skip entry that names the spec, if any
	// (execCritest sets it).
	excluded string
}

// kind is the spec's outcome: passed, failed (also panicked, timed out, interrupted),
// skipped (by the spec itself, with its reason), excluded (critestSkips) or not selected
// (critest runs no benchmark without -benchmark; CRISP_CRITEST_FOCUS).
func (s critestSpec) kind() string {
	switch s.State {
	case "passed":
		return "passed"
	case "skipped", "pending":
		if s.Failure.Message != "" {
			return "skipped"
		}
		if s.excluded != "" {
			return "excluded"
		}
		return "not selected"
	}
	return "failed"
}

// excludedWhy is the reason of the entry of skips that names the spec, if one is part
// of its full name (as --ginkgo.skip matches it).
func (s critestSpec) excludedWhy(skips []struct{ spec, why string }) string {
	for _, x := range skips {
		if strings.Contains(s.name(), x.spec) {
			return x.why
		}
	}
	return ""
}

func (s critestSpec) name() string {
	return strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
}

// reason is the first lines of the spec's failure or skip message and where it was.
func (s critestSpec) reason() string {
	if s.excluded != "" && s.State == "skipped" {
		return s.excluded
	}
	msg := strings.TrimSpace(s.Failure.Message)
	if lines := strings.Split(msg, "\n"); len(lines) > 6 {
		msg = strings.Join(lines[:6], "\n      ") + " ..."
	}
	if f := s.Failure.Location.FileName; f != "" {
		msg += fmt.Sprintf(" (%s:%d)", filepath.Base(f), s.Failure.Location.LineNumber)
	}
	return msg
}

func critestCount(res map[string]critestSpec) map[string]int {
	n := map[string]int{}
	for _, s := range res {
		n[s.kind()]++
	}
	return n
}

func sortedSpecs(res map[string]critestSpec) []string {
	names := make([]string, 0, len(res))
	for n := range res {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// critestSkipRegexp is a --ginkgo.skip regexp for the specs skips name.
func critestSkipRegexp(skips []struct{ spec, why string }) string {
	quoted := make([]string, len(skips))
	for i, s := range skips {
		quoted[i] = regexp.QuoteMeta(s.spec)
	}
	return strings.Join(quoted, "|")
}

// execCritest runs critest with args and a --ginkgo.skip of skips in dir (critest runs ipcmk and reads its config
// relative to its working directory) with env added to the test's environment, its
// output to logPath and its JSON report to report (args must ask for it:
// --ginkgo.json-report), and returns the specs by name.
// The System V shared memory segments its host IPC specs make (ipcmk) are removed.
func execCritest(t *testing.T, critest, dir string, args []string, skips []struct{ spec, why string }, env []string, logPath, report string) map[string]critestSpec {
	t.Helper()
	args = append(args[:len(args):len(args)], "--ginkgo.skip", critestSkipRegexp(skips))
	_ = os.Remove(report)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(critest, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	shmBefore := shmSegments()
	defer func() {
		for id := range shmSegments() {
			if !shmBefore[id] {
				_ = exec.Command("ipcrm", "-m", id).Run()
			}
		}
	}()
	// Failed specs make critest exit 1: the report says which.
	runErr := cmd.Run()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("critest wrote no report (%v, exit %v); its output is in %s", err, runErr, logPath)
	}
	var suites []struct{ SpecReports []critestSpec }
	if err := json.Unmarshal(b, &suites); err != nil {
		t.Fatalf("critest's report %s: %v", report, err)
	}
	res := map[string]critestSpec{}
	for _, suite := range suites {
		for _, s := range suite.SpecReports {
			if s.LeafNodeType != "It" {
				if s.State != "passed" && s.State != "skipped" {
					t.Errorf("critest's %s %s: %s", s.LeafNodeType, s.State, s.reason())
				}
				continue
			}
			if s.Failure.Message == "" {
				s.excluded = s.excludedWhy(skips)
			}
			res[s.name()] = s
		}
	}
	if len(res) == 0 {
		t.Fatalf("critest ran no spec; its output is in %s", logPath)
	}
	return res
}

// logCritestResults logs the counts of res and every spec that neither passed nor was
// left out by the focus, with its reason.
func logCritestResults(t *testing.T, what string, res map[string]critestSpec, took time.Duration) {
	t.Helper()
	n := critestCount(res)
	t.Logf("critest %s: %d passed, %d failed, %d skipped, %d excluded (--ginkgo.skip), %d not selected (benchmarks, focus) in %v",
		what, n["passed"], n["failed"], n["skipped"], n["excluded"], n["not selected"], took.Round(time.Second))
	for _, name := range sortedSpecs(res) {
		if k := res[name].kind(); k != "passed" && k != "not selected" {
			t.Logf("  %s: %s\n      %s", k, name, res[name].reason())
		}
	}
}
