package e2e

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestNodeMan: the package's man pages are installed where man finds them, and
// `man criserver`, `man shim-runc` and `man 5 crisp-config.toml` show their NAME and
// SYNOPSIS, on the node as an operator reads them (the VM image has man-db).
func TestNodeMan(t *testing.T) {
	if os.Getenv("CRISP_NODE") != "1" {
		t.Skip("node test: runs inside the node VM with the package installed (make test-node)")
	}
	if _, err := exec.LookPath("man"); err != nil {
		t.Fatalf("no man on the node (hack/nodevm/image/packages lists man-db): %v", err)
	}
	files, err := exec.Command("dpkg", "-L", "crisp").Output()
	if err != nil {
		t.Fatalf("dpkg -L crisp: %v", err)
	}
	for _, page := range []struct {
		args, file string
		want       []string
	}{
		{
			args: "criserver",
			file: "/usr/share/man/man8/criserver.8.gz",
			want: []string{"CRISERVER(8)", "NAME", "criserver - the Kubernetes CRI server of crisp",
				"SYNOPSIS", "criserver [--config FILE]", "criserver config default",
				"criserver [--config FILE] check [--kubelet-config FILE]", "crisp-config.toml(5)"},
		},
		{
			args: "shim-runc",
			file: "/usr/share/man/man8/shim-runc.8.gz",
			want: []string{"SHIM-RUNC(8)", "NAME", "shim-runc, containerd-shim-crisp-v1 - crisp's per-pod shim",
				"SYNOPSIS", "shim-runc -id ID -bundle DIR delete", "criserver(8)"},
		},
		{
			args: "shim-wasm",
			file: "/usr/share/man/man8/shim-wasm.8.gz",
			want: []string{"SHIM-WASM(8)", "NAME", "shim-wasm - crisp's per-pod shim for WebAssembly pods",
				"SYNOPSIS", "shim-wasm -id ID -bundle DIR delete", "shim-runc(8)"},
		},
		{
			args: "5 crisp-config.toml",
			file: "/usr/share/man/man5/crisp-config.toml.5.gz",
			want: []string{"CRISP-CONFIG.TOML(5)", "NAME", "crisp-config.toml - configuration file of criserver",
				"SYNOPSIS", "/etc/crisp/config.toml", "[runtimes]", "criserver(8)"},
		},
	} {
		if !strings.Contains(string(files), page.file+"\n") {
			t.Errorf("the package does not install %s", page.file)
		}
		// man -w: the page man would show is the package's file.
		where, err := exec.Command("man", append([]string{"-w"}, strings.Fields(page.args)...)...).Output()
		if err != nil || strings.TrimSpace(string(where)) != page.file {
			t.Errorf("man -w %s = %q (%v), want %s", page.args, strings.TrimSpace(string(where)), err, page.file)
		}
		cmd := exec.Command("man", append([]string{"-P", "cat"}, strings.Fields(page.args)...)...)
		cmd.Env = append(os.Environ(), "MANWIDTH=100", "MAN_KEEP_FORMATTING=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("man -P cat %s: %v\n%s", page.args, err, out)
			continue
		}
		text := plainMan(string(out))
		for _, w := range page.want {
			if !strings.Contains(text, w) {
				t.Errorf("man %s does not show %q:\n%s", page.args, w, out)
			}
		}
	}
}

var (
	overstrikeRE = regexp.MustCompile(".\b")
	sgrRE        = regexp.MustCompile("\x1b\\[[0-9;]*m")
	spaceRE      = regexp.MustCompile(`[ \t]+`)
	// groff may write Unicode hyphens, dashes and quotes for '-' and the apostrophe in a
	// UTF-8 locale.
	typography = strings.NewReplacer("\u2010", "-", "\u2011", "-", "\u2212", "-", "\u2013", "-", "\u2014", "-", "\u2019", "'")
)

// plainMan strips what a terminal would render (overstrike bold and underline, SGR
// escapes), turns groff's Unicode dashes and quotes back into ASCII and collapses the
// spaces that justification puts between words.
func plainMan(s string) string {
	s = sgrRE.ReplaceAllString(overstrikeRE.ReplaceAllString(s, ""), "")
	return spaceRE.ReplaceAllString(typography.Replace(s), " ")
}
