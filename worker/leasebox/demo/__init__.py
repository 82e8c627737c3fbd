"""`leasebox demo`: the whole flow on one machine, with a reference OTP API, and its verdict."""
