package soak

import "testing"

func TestFlat(t *testing.T) {
	ramp := make([]float64, 30)
	saw := make([]float64, 30)
	for i := range ramp {
		ramp[i] = float64(100 * i)
		saw[i] = float64(1000 + 100*(i%5))
	}
	for _, tc := range []struct {
		name    string
		samples []float64
		ok      bool
	}{
		{"constant", []float64{5, 5, 5, 5, 5, 5, 5, 5, 5}, true},
		{"sawtooth", saw, true},
		{"warm-up then flat", []float64{0, 50, 100, 100, 101, 99, 100, 100, 100}, true},
		{"linear growth", ramp, false},
		{"late jump", []float64{10, 10, 10, 10, 10, 10, 10, 10, 40}, false},
		{"too few samples", []float64{1, 1, 1}, false},
	} {
		err := Flat(Series{Name: tc.name, Samples: tc.samples, Tolerance: 0.2, Slack: 1})
		if (err == nil) != tc.ok {
			t.Errorf("Flat(%s) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
