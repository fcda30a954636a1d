"""Tolerances shared by the table tests that compare against a float64 reference."""

# Reference vs table: both do float64 math on the same float32 inputs, so they
# agree to the last float32 bit except for an occasional 1-ulp rounding
# difference (operation order); atol is one float32 ulp of weights of order 1,
# for values that later cancel to ~0.
RTOL = 1e-6
ATOL = 1e-7
