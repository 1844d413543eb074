package remote

import (
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// parsePlatform parses "os/arch[/variant]".
func parsePlatform(s string) (ocispec.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return ocispec.Platform{}, fmt.Errorf("platform %q: want os/arch[/variant], e.g. linux/amd64", s)
	}
	p := ocispec.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return normalizePlatform(p), nil
}

// normalizePlatform folds the spellings of one platform into one, as containerd's
// platforms.Normalize does, so "aarch64" matches "arm64" and "arm64/v8" matches "arm64".
func normalizePlatform(p ocispec.Platform) ocispec.Platform {
	p.OS = strings.ToLower(p.OS)
	arch, variant := strings.ToLower(p.Architecture), strings.ToLower(p.Variant)
	switch arch {
	case "i386":
		arch, variant = "386", ""
	case "x86_64", "x86-64", "amd64":
		arch = "amd64"
		if variant == "v1" {
			variant = ""
		}
	case "aarch64", "arm64":
		arch = "arm64"
		switch variant {
		case "8", "v8", "v8.0":
			variant = ""
		}
	case "armhf":
		arch, variant = "arm", "v7"
	case "armel":
		arch, variant = "arm", "v6"
	case "arm":
		switch variant {
		case "", "7":
			variant = "v7"
		case "5", "6", "8":
			variant = "v" + variant
		}
	}
	p.Architecture, p.Variant = arch, variant
	return p
}

func platformString(p ocispec.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// selectManifest returns the entry of an index for platform want: the first whose
// platform matches exactly after normalization, else the first without a platform
// (which containerd also accepts). Attestations (platform unknown/unknown) never match.
func selectManifest(idx *ocispec.Index, want ocispec.Platform) (ocispec.Descriptor, error) {
	var fallback *ocispec.Descriptor
	var seen []string
	for i, d := range idx.Manifests {
		if d.Platform == nil {
			if fallback == nil && d.Annotations["vnd.docker.reference.type"] == "" {
				fallback = &idx.Manifests[i]
			}
			continue
		}
		p := normalizePlatform(*d.Platform)
		seen = append(seen, platformString(p))
		if p.OS == want.OS && p.Architecture == want.Architecture && p.Variant == want.Variant {
			return d, nil
		}
	}
	if fallback != nil {
		return *fallback, nil
	}
	return ocispec.Descriptor{}, fmt.Errorf("no image for platform %s in the index (it has: %s)",
		platformString(want), strings.Join(seen, ", "))
}
