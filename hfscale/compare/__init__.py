"""Many runs side by side: sweep (launch a cross product), report (tables and plots), parity (same model as ddp?),
megatron (Megatron-LM logs as rows). They read runs only through results.json and `hfscale.launching`."""
