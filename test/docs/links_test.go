package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// markdownFiles are README.md and every markdown file under docs/, relative to the
// repository root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list docs: %v", err)
	}
	return files
}

var (
	fenceRE   = regexp.MustCompile("^\\s*(```|~~~)")
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	// linkRE finds inline links and images: [text](target) with an optional title.
	linkRE = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// inlineLinkRE is a link inside a heading, which GitHub's anchor takes the text of.
	inlineLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// prose returns the lines of a markdown file outside fenced code blocks, with their
// numbers; text in fences is code, not links or headings.
func prose(text string) (lines []string, numbers []int) {
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if !inFence {
			lines = append(lines, line)
			numbers = append(numbers, i+1)
		}
	}
	return lines, numbers
}

// slug is the anchor GitHub gives a heading: lower case, every character but
// letters, digits, '_', '-' and spaces dropped, spaces turned into '-'.
func slug(heading string) string {
	heading = inlineLinkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors lists the heading anchors of a markdown file as GitHub numbers them: a
// repeated slug gets -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines, _ := prose(text)
	for _, line := range lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocsLinks: every relative link in README.md and docs/ names a file or directory
// of the repository, and a #anchor into a markdown file names one of its headings.
// Absolute links (http, https, mailto) are not followed.
func TestDocsLinks(t *testing.T) {
	root := testutil.RepoRoot()
	texts := map[string]string{}
	read := func(rel string) (string, error) {
		if s, ok := texts[rel]; ok {
			return s, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", err
		}
		texts[rel] = string(b)
		return texts[rel], nil
	}
	checked := 0
	for _, file := range markdownFiles(t, root) {
		text, err := read(file)
		if err != nil {
			t.Fatal(err)
		}
		lines, numbers := prose(text)
		for i, line := range lines {
			for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(line, "code"), -1) {
				target := m[1]
				if target == "" {
					t.Errorf("%s:%d: empty link target", file, numbers[i])
					continue
				}
				if u, err := url.Parse(target); err == nil && u.Scheme != "" {
					continue
				}
				checked++
				if err := checkLink(root, file, target, read); err != nil {
					t.Errorf("%s:%d: link %q: %v", file, numbers[i], target, err)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link scanner is broken")
	}
	t.Logf("%d relative links checked", checked)
}

// checkLink resolves a relative link of the markdown file from (relative to root).
func checkLink(root, from, target string, read func(string) (string, error)) error {
	path, anchor, _ := strings.Cut(target, "#")
	path, err := url.PathUnescape(path)
	if err != nil {
		return err
	}
	rel := from
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return fmt.Errorf("absolute path: links must be relative to the file")
		}
		rel = filepath.Clean(filepath.Join(filepath.Dir(from), path))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("leads out of the repository")
		}
		if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
			return fmt.Errorf("no such file or directory: %s", rel)
		}
	}
	if anchor == "" || !strings.HasSuffix(rel, ".md") {
		return nil
	}
	text, err := read(rel)
	if err != nil {
		return err
	}
	if !anchors(text)[anchor] {
		return fmt.Errorf("%s has no heading with anchor #%s", rel, anchor)
	}
	return nil
}

// TestSlug pins the anchor rules to headings of the kinds the docs use.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Pod NAT (`cni.masquerade`)":                    "pod-nat-cnimasquerade",
		"Under containerd 2.x (`sandboxer = \"shim\"`)": "under-containerd-2x-sandboxer--shim",
		"`runtimes.<name>.warm_spare`":                  "runtimesnamewarm_spare",
		"The node VM: `make test-node`":                 "the-node-vm-make-test-node",
		"See [Metrics](metrics.md) here":                "see-metrics-here",
		"CRIU on VMs: `CRIU_FAULT=130`":                 "criu-on-vms-criu_fault130",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	got := anchors("# A\n\n## A\n\n```\n# not a heading\n```\n## B\n")
	for _, want := range []string{"a", "a-1", "b"} {
		if !got[want] {
			t.Errorf("anchors: no %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a line in a code fence counted as a heading")
	}
}
