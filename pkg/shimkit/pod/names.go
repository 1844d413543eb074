package pod

import "strings"

// The shim checks names by hand rather than with regexps: every shim, and every
// container init and exec the shim re-executes, runs this package's initialisation,
// and compiling the four patterns cost 130 KB of allocations each time (measured with
// GODEBUG=inittrace=1).

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// allIn reports whether s is non-empty and made only of alphanumerics and extra.
func allIn(s, extra string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}

// validSandboxID: an alphanumeric, then up to 127 of [A-Za-z0-9_.-].
func validSandboxID(id string) bool {
	return len(id) <= 128 && id != "" && isAlnum(id[0]) && allIn(id, "_.-")
}

// validHostname: [A-Za-z0-9.-], starting and ending with an alphanumeric.
func validHostname(h string) bool {
	return h != "" && isAlnum(h[0]) && isAlnum(h[len(h)-1]) && allIn(h, ".-")
}

// validSysctlName: dot-separated words, at least two; the first of [A-Za-z0-9_], the
// rest of [A-Za-z0-9_-].
func validSysctlName(k string) bool {
	first, rest, ok := strings.Cut(k, ".")
	if !ok || !allIn(first, "_") {
		return false
	}
	for _, w := range strings.Split(rest, ".") {
		if !allIn(w, "_-") {
			return false
		}
	}
	return true
}

// validSliceName: [A-Za-z0-9_.@-]+ followed by ".slice".
func validSliceName(s string) bool {
	name, ok := strings.CutSuffix(s, ".slice")
	return ok && allIn(name, "_.@-")
}
