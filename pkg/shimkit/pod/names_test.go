package pod

import (
	"regexp"
	"strings"
	"testing"
)

// TestNamesMatchPatterns checks the hand-written checks against the patterns they
// replace, on inputs around every rule.
func TestNamesMatchPatterns(t *testing.T) {
	long := strings.Repeat("a", 127)
	inputs := []string{
		"", "a", "A", "0", "_", ".", "-", "@", "a_", "a.", "a-", "_a", ".a", "-a", "ab", "a b", "a\n",
		"a" + long, "a" + long + "b", "a.b", "a..b", "a.b.", ".a.b", "a_b.c-d", "a-b.c", "a.b_c", "a.-",
		"net.ipv4.ip_forward", "kernel.shm_rmid_forced", "net.ipv4.conf.all.rp_filter", "net", "net.",
		"host-1", "host.example.com", "-host", "host-", "h", "h.", "x.slice", ".slice", "a@b.slice",
		"system.slice", "kubepods-besteffort.slice", "a/b.slice", "a.slice.x", "é", "aé", "a\x00b",
	}
	cases := []struct {
		name    string
		pattern string
		check   func(string) bool
	}{
		{"sandbox id", `^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, validSandboxID},
		{"hostname", `^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`, validHostname},
		{"sysctl", `^[A-Za-z0-9_]+(\.[A-Za-z0-9_-]+)+$`, validSysctlName},
		{"slice", `^[A-Za-z0-9_.@-]+\.slice$`, validSliceName},
	}
	for _, c := range cases {
		re := regexp.MustCompile(c.pattern)
		for _, in := range inputs {
			if got, want := c.check(in), re.MatchString(in); got != want {
				t.Errorf("%s %q: %v, the pattern says %v", c.name, in, got, want)
			}
		}
	}
}
