package remote

import "testing"

func TestWasmFileName(t *testing.T) {
	for title, want := range map[string]string{
		"":                  "module.wasm",
		"hello.wasm":        "hello.wasm",
		"hello":             "hello.wasm",
		"./dist/app.wasm":   "app.wasm",
		"/abs/app.wasm":     "app.wasm",
		"../../etc/passwd":  "passwd.wasm",
		"..":                "module.wasm",
		"/":                 "module.wasm",
		`C:\build\app.wasm`: "app.wasm",
		"bad\nname.wasm":    "module.wasm",
		"dir/":              "dir.wasm",
		"spaces ok.wasm":    "spaces ok.wasm",
	} {
		if got := WasmFileName(title); got != want {
			t.Errorf("WasmFileName(%q) = %q, want %q", title, got, want)
		}
	}
}
