package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
)

// deepLayer is a layer of 25,000 small files in 1,250 directories eight levels deep, as
// a language runtime's site-packages is: the guard's per-entry work (a path component
// check per level) dominates over the bytes. withDirs adds an entry per directory, as
// tar tools write; without, every directory is created implicitly.
func deepLayer(b *testing.B, withDirs bool) []byte {
	return deepLayerN(b, "python3", 5, withDirs)
}

// deepLayerN is deepLayer with its files under usr/lib/name, n*5,000 of them.
func deepLayerN(b *testing.B, name string, n int, withDirs bool) []byte {
	var entries []entry
	root := "usr/lib/" + name + "/site-packages/"
	for _, d := range []string{"usr/", "usr/lib/", "usr/lib/" + name + "/", root} {
		if withDirs {
			entries = append(entries, dirE(d, 0o755))
		}
	}
	for a := range n {
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

// BenchmarkImageUnpack unpacks an image of four layers of 6,250 small files each (and
// a 16 MiB file each): Apply one after the other, as image pulls did, or Unpack all at
// once and Commit bottom-up.
func BenchmarkImageUnpack(b *testing.B) {
	var datas [][]byte
	for i := range 4 {
		d := deepLayerN(b, fmt.Sprintf("lib%d", i), 1, true)
		// The tar's end is two zero blocks; append a big file before them.
		big := layerTar(b, fileE(fmt.Sprintf("big%d", i), string(bytes.Repeat([]byte{byte(i)}, 16<<20)), 0o644))
		datas = append(datas, append(d[:len(d)-1024:len(d)-1024], big...))
	}
	var total int64
	for _, d := range datas {
		total += int64(len(d))
	}
	for _, mode := range []string{"sequential", "concurrent"} {
		b.Run(mode, func(b *testing.B) {
			f := newFixture(b, "")
			b.SetBytes(total)
			var commits time.Duration
			defer func() {
				if mode == "concurrent" {
					// The part of the critical path only Commit (its syncfs) takes.
					b.ReportMetric(float64(commits.Milliseconds())/float64(b.N), "commit-ms/op")
				}
			}()
			for i := range b.N {
				b.StopTimer()
				salt := []byte(strconv.Itoa(i))
				var chain []digest.Digest
				var parent digest.Digest
				for _, d := range datas {
					parent = chainID(parent, append(d[:len(d):len(d)], salt...))
					chain = append(chain, parent)
				}
				b.StartTimer()
				switch mode {
				case "sequential":
					var parent digest.Digest
					for l, d := range datas {
						if _, err := f.s.Apply(context.Background(), chain[l], parent, "bench", bytes.NewReader(d)); err != nil {
							b.Fatal(err)
						}
						parent = chain[l]
					}
				case "concurrent":
					commits += unpackAll(b, f.s, chain, datas)
				}
				b.StopTimer()
				for l := len(chain) - 1; l >= 0; l-- {
					if err := f.s.Remove(chain[l]); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
		})
	}
}

// unpackAll unpacks every layer at once and commits them bottom-up; it returns the time
// the commits took together.
func unpackAll(b *testing.B, s *Snapshotter, chain []digest.Digest, datas [][]byte) time.Duration {
	var mu sync.Mutex
	var commits time.Duration
	ctx := context.Background()
	done := make([]chan error, len(datas))
	for l := range datas {
		done[l] = make(chan error, 1)
	}
	var wg sync.WaitGroup
	for l := range datas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := s.Claim(ctx, chain[l])
			if err != nil {
				done[l] <- err
				return
			}
			defer c.Release()
			p, err := s.Unpack(ctx, "bench", bytes.NewReader(datas[l]))
			if err != nil {
				done[l] <- err
				return
			}
			var parent digest.Digest
			if l > 0 {
				if err := <-done[l-1]; err != nil {
					_ = p.Discard()
					done[l-1] <- err
					done[l] <- err
					return
				}
				done[l-1] <- nil
				parent = chain[l-1]
			}
			start := time.Now()
			_, err = s.Commit(ctx, c, p, parent)
			mu.Lock()
			commits += time.Since(start)
			mu.Unlock()
			done[l] <- err
		}()
	}
	wg.Wait()
	if err := <-done[len(datas)-1]; err != nil {
		b.Fatal(err)
	}
	return commits
}
