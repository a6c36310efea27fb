"""One program per language that behaves as the first word of its input says, so one compile covers every verdict.

``ok A B`` prints A+B; ``wrong A B`` prints A+B+1; ``slow`` spins on the CPU; ``sleep`` sleeps;
``mem`` allocates (and touches) memory without end; ``crash`` fails the language's usual way.
``CASES`` are one case per behaviour, each expecting A+B; ``EXPECTED`` their verdicts.
"""

from __future__ import annotations

from cwsandbox_async.judge import TestCase, Verdict

CASES = [
    TestCase("ok 2 3\n", "5\n", name="ok"),
    TestCase("wrong 2 3\n", "5\n", name="wrong"),
    TestCase("slow 2 3\n", "5\n", name="slow"),
    TestCase("sleep 2 3\n", "5\n", name="sleep"),
    TestCase("mem 2 3\n", "5\n", name="mem"),
    TestCase("crash 2 3\n", "5\n", name="crash"),
]
EXPECTED = [
    Verdict.ACCEPTED,
    Verdict.WRONG_ANSWER,
    Verdict.TIME_LIMIT,
    Verdict.TIME_LIMIT,
    Verdict.MEMORY_LIMIT,
    Verdict.RUNTIME_ERROR,
]

PROGRAMS = {
    "python": """
import sys, time
mode, a, b = sys.stdin.read().split()
a, b = int(a), int(b)
if mode == "ok": print(a + b)
elif mode == "wrong": print(a + b + 1)
elif mode == "slow":
    while True: pass
elif mode == "sleep": time.sleep(600)
elif mode == "mem":
    keep = []
    while True: keep.append(bytearray(b"x" * (16 << 20)))
else: print(1 // 0)
""",
    "c": r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    char mode[16]; long a, b;
    if (scanf("%15s %ld %ld", mode, &a, &b) != 3) return 2;
    if (!strcmp(mode, "ok")) printf("%ld\n", a + b);
    else if (!strcmp(mode, "wrong")) printf("%ld\n", a + b + 1);
    else if (!strcmp(mode, "slow")) { volatile long x = 0; for (;;) x++; }
    else if (!strcmp(mode, "sleep")) sleep(600);
    else if (!strcmp(mode, "mem")) for (;;) { char *p = malloc(16 << 20); if (!p) return 3; memset(p, 1, 16 << 20); }
    else { volatile int *p = 0; *p = 1; }
    return 0;
}
""",
    "cpp": r"""
#include <iostream>
#include <string>
#include <vector>
#include <stdexcept>
#include <thread>
#include <chrono>
int main() {
    std::string mode; long a, b;
    std::cin >> mode >> a >> b;
    if (mode == "ok") std::cout << a + b << "\n";
    else if (mode == "wrong") std::cout << a + b + 1 << "\n";
    else if (mode == "slow") { volatile long x = 0; for (;;) x++; }
    else if (mode == "sleep") std::this_thread::sleep_for(std::chrono::seconds(600));
    else if (mode == "mem") { std::vector<std::vector<char>> keep; for (;;) keep.emplace_back(16 << 20, 'x'); }
    else throw std::runtime_error("crash");
}
""",
    "java": r"""
import java.util.*;
public class Solution {
    public static void main(String[] args) throws Exception {
        Scanner in = new Scanner(System.in);
        String mode = in.next(); long a = in.nextLong(), b = in.nextLong();
        if (mode.equals("ok")) System.out.println(a + b);
        else if (mode.equals("wrong")) System.out.println(a + b + 1);
        else if (mode.equals("slow")) { long x = 0; while (true) x++; }
        else if (mode.equals("sleep")) Thread.sleep(600000);
        else if (mode.equals("mem")) {
            List<byte[]> keep = new ArrayList<>();
            while (true) { byte[] c = new byte[16 << 20]; Arrays.fill(c, (byte) 1); keep.add(c); }
        }
        else throw new RuntimeException("crash");
    }
}
""",
    "javascript": r"""
const [mode, a, b] = require("fs").readFileSync(0, "utf8").trim().split(/\s+/);
const x = Number(a), y = Number(b);
if (mode === "ok") console.log(x + y);
else if (mode === "wrong") console.log(x + y + 1);
else if (mode === "slow") { for (;;) {} }
else if (mode === "sleep") setTimeout(() => {}, 600000);
else if (mode === "mem") { const keep = []; for (;;) keep.push(new Array(1 << 20).fill(1.5)); }
else throw new Error("crash");
""",
    "go": r"""
package main

import (
	"fmt"
	"time"
)

func main() {
	var mode string
	var a, b int64
	fmt.Scan(&mode, &a, &b)
	switch mode {
	case "ok":
		fmt.Println(a + b)
	case "wrong":
		fmt.Println(a + b + 1)
	case "slow":
		x := 0
		for {
			x++
		}
	case "sleep":
		time.Sleep(600 * time.Second)
	case "mem":
		var keep [][]byte
		for {
			c := make([]byte, 16<<20)
			for i := range c {
				c[i] = 1
			}
			keep = append(keep, c)
		}
	default:
		panic("crash")
	}
}
""",
    "rust": r"""
use std::io::Read;
fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let v: Vec<&str> = s.split_whitespace().collect();
    let (a, b): (i64, i64) = (v[1].parse().unwrap(), v[2].parse().unwrap());
    match v[0] {
        "ok" => println!("{}", a + b),
        "wrong" => println!("{}", a + b + 1),
        "slow" => { let mut x: u64 = 0; loop { x = std::hint::black_box(x + 1); } }
        "sleep" => std::thread::sleep(std::time::Duration::from_secs(600)),
        "mem" => { let mut keep: Vec<Vec<u8>> = Vec::new(); loop { keep.push(vec![1u8; 16 << 20]); } }
        _ => panic!("crash"),
    }
}
""",
}

#: A source that does not compile (Python: a syntax error), per language.
BROKEN = {
    "python": "def f(:\n    pass\n",
    "c": "int main(void) { return x; }\n",
    "cpp": "int main() { undeclared(); }\n",
    "java": 'public class Main { public static void main(String[] a) { int x = "s"; } }\n',
    "javascript": "function (\n",
    "go": "package main\nfunc main() { x := 1 }\n",
    "rust": 'fn main() { let x: i32 = "s"; }\n',
}
