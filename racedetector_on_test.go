// SPDX-License-Identifier: Apache-2.0

//go:build race

package perfbuf

// raceDetector: built with -race, under which sync.Pool drops items at
// random, so that allocation counts vary from call to call.
const raceDetector = true
