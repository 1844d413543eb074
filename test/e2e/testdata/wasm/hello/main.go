// Command hello is the WebAssembly module of the wasm end-to-end tests
// (test/e2e/wasm_test.go), built for wasip1 by the tests. It prints its arguments and
// the variables GREETING, FROM_IMAGE and NAME on stdout and a line on stderr, then does
// what its KEY=VALUE arguments say, in order:
//
//	read=PATH   print what PATH (in its rootfs) holds: its first line, or the size
//	            of a WebAssembly module
//	hog=MIB     allocate MIB mebibytes, touching every page, and keep them
//	sleep=DUR   sleep for DUR (a Go duration, or "forever")
//	exit=CODE   exit with CODE (the default is $EXIT_CODE, else 0)
//	cat=PREFIX  print each line of stdin after PREFIX until its end, then "cat: N lines"
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// kept holds what hog allocated, so that it cannot be collected.
var kept [][]byte

func main() {
	for i, a := range os.Args {
		fmt.Printf("arg[%d]=%s\n", i, a)
	}
	for _, k := range []string{"GREETING", "FROM_IMAGE", "NAME"} {
		fmt.Printf("%s=%s\n", k, os.Getenv(k))
	}
	fmt.Fprintln(os.Stderr, "hello from stderr")
	code := 0
	if v := os.Getenv("EXIT_CODE"); v != "" {
		code = atoi(v)
	}
	for _, a := range os.Args[1:] {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "read":
			b, err := os.ReadFile(v)
			if err != nil {
				fmt.Fprintln(os.Stderr, "hello:", err)
				os.Exit(1)
			}
			if bytes.HasPrefix(b, []byte("\x00asm")) {
				fmt.Printf("read %s: a WebAssembly module of %d bytes\n", v, len(b))
			} else {
				line, _, _ := strings.Cut(string(b), "\n")
				fmt.Printf("read %s: %s\n", v, line)
			}
		case "hog":
			for i := range atoi(v) {
				b := make([]byte, 1<<20)
				for j := 0; j < len(b); j += 4096 {
					b[j] = byte(i)
				}
				kept = append(kept, b)
			}
			fmt.Printf("allocated %d MiB\n", len(kept))
		case "sleep":
			d := 1000 * time.Hour
			if v != "forever" {
				var err error
				if d, err = time.ParseDuration(v); err != nil {
					fmt.Fprintln(os.Stderr, "hello:", err)
					os.Exit(2)
				}
			}
			fmt.Println("sleeping")
			time.Sleep(d)
			fmt.Println("woke up")
		case "cat":
			n := 0
			for sc := bufio.NewScanner(os.Stdin); sc.Scan(); n++ {
				fmt.Println(v + sc.Text())
			}
			fmt.Printf("cat: %d lines\n", n)
		case "exit":
			code = atoi(v)
		}
	}
	os.Exit(code)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(2)
	}
	return n
}
