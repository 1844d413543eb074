package docs

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// handlerKey stands for the name of a [runtimes.NAME] table in dotted keys.
const handlerKey = "<name>"

// defaultKeys are the dotted keys of what `criserver config default` prints (the same
// function: config.Default().Marshal()), decoded as plain TOML. A table that is empty
// by default (registry.mirrors) is one key; the handler names under runtimes become
// <name>.
func defaultKeys(t *testing.T) map[string]bool {
	t.Helper()
	out, err := config.Default().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := toml.Unmarshal(out, &m); err != nil {
		t.Fatalf("decode the default config: %v\n%s", err, out)
	}
	keys := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		table, ok := v.(map[string]any)
		if !ok || (len(table) == 0 && prefix != "") {
			keys[prefix] = true
			return
		}
		for k, sub := range table {
			if prefix == "runtimes" {
				k = handlerKey
			}
			walk(join(prefix, k), sub)
		}
	}
	walk("", m)
	return keys
}

// structKeys are the dotted keys of config.Config's toml tags, which include the keys
// the default config leaves out (omitempty: runtimes.<name>.sandbox_mode, .options).
func structKeys() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			key := join(prefix, name)
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(config.Duration(0)):
				walk(key, f.Type)
			case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
				walk(join(key, handlerKey), f.Type.Elem())
			default:
				keys[key] = true
			}
		}
	}
	walk("", reflect.TypeOf(config.Config{}))
	return keys
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// configKeys are every key of the config file: what the default prints plus what
// the Config type can hold.
func configKeys(t *testing.T) map[string]bool {
	t.Helper()
	keys := defaultKeys(t)
	st := structKeys()
	for k := range keys {
		if !st[k] {
			t.Errorf("default config key %q is not a field of config.Config: the two key lists disagree", k)
		}
	}
	for k := range st {
		keys[k] = true
	}
	if len(keys) < 10 {
		t.Fatalf("only %d config keys found: the key walk is broken", len(keys))
	}
	return keys
}

// keyHeadingRE is how docs/configuration.md documents a key: a heading of its own,
// "### `section.key`".
var keyHeadingRE = regexp.MustCompile("^###\\s+`([^`]+)`\\s*$")

// TestConfigurationReference: docs/configuration.md documents every config key, each
// under a heading "### `section.key`", and no key the config does not have.
func TestConfigurationReference(t *testing.T) {
	keys := configKeys(t)
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	lines, _ := prose(string(b))
	for _, line := range lines {
		if m := keyHeadingRE.FindStringSubmatch(line); m != nil {
			if documented[m[1]] {
				t.Errorf("docs/configuration.md documents %q twice", m[1])
			}
			documented[m[1]] = true
		}
	}
	for _, k := range sorted(keys) {
		if !documented[k] {
			t.Errorf("config key %q is not documented in docs/configuration.md: add a heading \"### `%s`\" with its default and meaning", k, k)
		}
	}
	for _, k := range sorted(documented) {
		if !keys[k] {
			t.Errorf("docs/configuration.md documents %q, which is not a config key", k)
		}
	}
	t.Logf("%d keys documented", len(documented))
}

// TestConfigManPage: the crisp-config.toml(5) man page names every section of the
// config as **[section]** and every key of it in bold.
func TestConfigManPage(t *testing.T) {
	keys := configKeys(t)
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "docs", "man", "crisp-config.toml.5.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	sections := map[string]bool{}
	for k := range keys {
		if section, _, ok := strings.Cut(k, "."); ok {
			sections[section] = true
		}
	}
	if len(sections) == 0 {
		t.Fatal("no config sections found")
	}
	for _, s := range sorted(sections) {
		if !strings.Contains(page, "**["+s+"]**") {
			t.Errorf("docs/man/crisp-config.toml.5.md does not name section [%s] (as **[%s]**)", s, s)
		}
	}
	for _, k := range sorted(keys) {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !strings.Contains(page, "**"+leaf+"**") {
			t.Errorf("docs/man/crisp-config.toml.5.md does not name key %s (as **%s**)", k, leaf)
		}
	}
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
