package config

import (
	"reflect"
	"sort"
	"strings"
)

// reloadable are the keys criserver applies on SIGHUP. Every other key takes effect at
// the next start only: it shaped a socket, a directory, a listener or a component that
// running pods depend on. A key added to Config is therefore a restart key until the
// reload applies it and it is listed here.
var reloadable = map[string]bool{
	"log_level":                         true,
	"registry.mirrors":                  true,
	"registry.insecure":                 true,
	"registry.max_concurrent_downloads": true,
	"registry.config_path":              true,
	"registry.auth_file":                true,
	"image.pull_progress_timeout":       true,
	"image.signature_policy":            true,
	"image.pinned":                      true,
}

// Reloadable reports whether criserver applies key (a dotted TOML key such as
// "registry.mirrors") when it reloads its config file on SIGHUP.
func Reloadable(key string) bool { return reloadable[key] }

// ChangedKeys lists, sorted, the dotted TOML keys whose values differ between old and
// new. Tables are compared key by key; a map or a list is one key (runtimes,
// cni.bin_dirs, registry.mirrors), and an empty one equals a missing one.
func ChangedKeys(old, new Config) []string {
	var keys []string
	forEachKey("", reflect.ValueOf(&old).Elem(), reflect.ValueOf(new), func(key string, a, b reflect.Value) {
		if !sameValue(a, b) {
			keys = append(keys, key)
		}
	})
	sort.Strings(keys)
	return keys
}

// RestartKeys lists, sorted, the keys that differ between old and new and that a
// reload does not apply: they need a restart of criserver.
func RestartKeys(old, new Config) []string {
	var out []string
	for _, k := range ChangedKeys(old, new) {
		if !Reloadable(k) {
			out = append(out, k)
		}
	}
	return out
}

// Reloaded returns running with its reloadable keys taken from file: the settings in
// force once file has been reloaded. Comparing the next file with it names exactly
// the keys that differ from what runs, including those a previous reload could not
// apply.
func Reloaded(running, file Config) Config {
	out := running
	forEachKey("", reflect.ValueOf(&out).Elem(), reflect.ValueOf(file), func(key string, dst, src reflect.Value) {
		if Reloadable(key) {
			dst.Set(src)
		}
	})
	return out
}

// forEachKey calls fn with every leaf key of two values of one struct type, found by
// the fields' toml tags, so that a key added to Config is covered without this code
// knowing of it. Tables recurse; anything else (maps and lists too) is a leaf.
func forEachKey(prefix string, a, b reflect.Value, fn func(key string, a, b reflect.Value)) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if f.Type.Kind() == reflect.Struct {
			forEachKey(prefix+name+".", a.Field(i), b.Field(i), fn)
			continue
		}
		fn(prefix+name, a.Field(i), b.Field(i))
	}
}

// sameValue compares two leaf values; a nil and an empty map or list are the same
// setting (a file's "mirrors = {}" and the default).
func sameValue(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Map, reflect.Slice:
		if a.Len() == 0 && b.Len() == 0 {
			return true
		}
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}
