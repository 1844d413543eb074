package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// deepLayer is a layer of 25,000 small files in 1,250 directories eight levels deep, as
// a language runtime's site-packages is: the guard's per-entry work (a path component
// check per level) dominates over the bytes. withDirs adds an entry per directory, as
// tar tools write; without, every directory is created implicitly.
func deepLayer(b *testing.B, withDirs bool) []byte {
	var entries []entry
	const root = "usr/lib/python3/site-packages/"
	for _, d := range []string{"usr/", "usr/lib/", "usr/lib/python3/", root} {
		if withDirs {
			entries = append(entries, dirE(d, 0o755))
		}
	}
	for a := range 5 {
		for s := range 5 {
			for u := range 5 {
				for v := range 10 {
					dir := fmt.Sprintf("%sp%d/m%d/s%d/t%d/", root, a, s, u, v)
					if withDirs {
						for i, p := range []string{
							fmt.Sprintf("%sp%d/", root, a), fmt.Sprintf("%sp%d/m%d/", root, a, s),
							fmt.Sprintf("%sp%d/m%d/s%d/", root, a, s, u), dir,
						} {
							// Each directory once, at its first file.
							if i == 0 && (s|u|v) != 0 || i == 1 && (u|v) != 0 || i == 2 && v != 0 {
								continue
							}
							entries = append(entries, dirE(p, 0o755))
						}
					}
					for f := range 20 {
						entries = append(entries, fileE(dir+"f"+strconv.Itoa(f)+".py", "print(1)\n", 0o644))
					}
				}
			}
		}
	}
	return layerTar(b, entries...)
}

// BenchmarkApplyDeep applies deepLayer on top of a base layer holding its top
// directories (so that the lower layers are consulted).
func BenchmarkApplyDeep(b *testing.B) {
	for _, withDirs := range []bool{true, false} {
		b.Run(fmt.Sprintf("dirs=%v", withDirs), func(b *testing.B) {
			f := newFixture(b, "")
			base := applyAll(b, f.s, layerTar(b, dirE("usr/", 0o755), dirE("usr/lib/", 0o755), fileE("usr/lib/x", "x", 0o644)))[0]
			data := deepLayer(b, withDirs)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := range b.N {
				c := digest.FromString(strconv.Itoa(i))
				if _, err := f.s.Apply(context.Background(), c, base, "bench", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := f.s.Remove(c); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
