// Times Porcupine's checker on history files given by pulsar-chaos's bench/lin_kv.py, which copies
// this file into a Porcupine checkout for the run (and removes it after). It uses the parsers and
// models of Porcupine's own tests (parseKvLog and kvModel, parseJepsenLog and etcdModel in
// porcupine_test.go), so the histories are checked exactly as Porcupine's kv and etcd tests check
// theirs. One line per file: PCBENCH {"file": ..., "ok": ..., "median_ns": ..., "min_ns": ...}.
package porcupine

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

func pcTime(t *testing.T, file string, events []Event, model Model, repeat int) {
	var times []int64
	ok := false
	for i := 0; i < repeat; i++ {
		start := time.Now()
		ok = CheckEvents(model, events)
		times = append(times, time.Since(start).Nanoseconds())
	}
	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	line, _ := json.Marshal(map[string]interface{}{
		"file": file, "ok": ok, "median_ns": times[len(times)/2], "min_ns": times[0],
	})
	fmt.Println("PCBENCH " + string(line))
}

func pcFiles(name string) []string {
	v := os.Getenv(name)
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func TestPulsarChaosTimes(t *testing.T) {
	repeat, err := strconv.Atoi(os.Getenv("PC_REPEAT"))
	if err != nil || repeat < 1 {
		repeat = 5
	}
	for _, f := range pcFiles("PC_KV_FILES") {
		pcTime(t, f, parseKvLog(f), kvModel, repeat)
	}
	for _, f := range pcFiles("PC_ETCD_FILES") {
		pcTime(t, f, parseJepsenLog(f), etcdModel, repeat)
	}
}
