// Command probe is the test module of package run, built for wasip1 by the tests:
// its first argument says what to do, the rest are that command's arguments.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// spins is what the spin command counts, global so that the loop is not optimized out.
var spins int

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe COMMAND ARGS...")
		os.Exit(64)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "true":
	case "hello":
		fmt.Println("hello from stdout")
		fmt.Fprintln(os.Stderr, "hello from stderr")
	case "args":
		// Every argument (the program name included) on its own line.
		for _, a := range os.Args {
			fmt.Println(a)
		}
	case "getenv":
		for _, k := range args {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
	case "exit":
		code, _ := strconv.Atoi(args[0])
		os.Exit(code)
	case "cat":
		b, err := os.ReadFile(args[0])
		check(err)
		os.Stdout.Write(b)
	case "write":
		check(os.WriteFile(args[0], []byte(args[1]), 0o644))
		fmt.Println("wrote", args[0])
	case "cwd":
		wd, err := os.Getwd()
		check(err)
		fmt.Println(wd)
	case "hog":
		// Allocates MiB mebibytes one at a time, touching each page, and keeps them.
		mib, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for i := range mib {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = byte(i)
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep), "MiB")
	case "sleep":
		d, err := time.ParseDuration(args[0])
		check(err)
		fmt.Println("sleeping")
		time.Sleep(d)
		fmt.Println("woke up")
	case "spin":
		fmt.Println("spinning")
		for {
			spins++
		}
	default:
		fmt.Fprintln(os.Stderr, "probe: unknown command", os.Args[1])
		os.Exit(64)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}
