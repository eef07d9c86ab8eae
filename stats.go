package perfbuf

// What Stats adds to the counts the read side publishes: each ring's fill
// at the time of the call, and the failure map's counts (failures.go).

// completeStats fills in st (one entry per ring of raw, a copy the caller
// owns) with what is read at the time of the call: each ring's fill, while
// life says the rings are mapped, and the failures of failures (nil for
// none), which may append entries. It may run on any goroutine: Used loads
// data_head and data_tail atomically, and failures has a lock of its own.
func completeStats(st []Stats, raw []*RawBuffer, life *lifetime, failures *failureMap) []Stats {
	if life.enter("") == nil {
		for i := range st {
			st[i].Fill = raw[i].Used()
		}
		life.exit()
	}
	return failures.addTo(st)
}
