package bootstrap

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ClockBootTime returns when the kernel booted as CLOCK_REALTIME − CLOCK_BOOTTIME (nanoseconds;
// CLOCK_BOOTTIME counts suspend too, as /proc/<pid>/stat's starttime does). A wall-clock step
// after a process started moves it: a documented limit of every start-time comparison.
func ClockBootTime() (time.Time, error) {
	var rt, bt unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &bt); err != nil {
		return time.Time{}, fmt.Errorf("read CLOCK_BOOTTIME: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		return time.Time{}, fmt.Errorf("read CLOCK_REALTIME: %w", err)
	}
	return time.Unix(0, rt.Nano()-bt.Nano()), nil
}
