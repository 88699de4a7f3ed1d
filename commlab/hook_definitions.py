"""What each classic compressor sends, against its paper and GRACE's code: the words of the hook
table's ``definition`` records (``commlab.hook_row.Definition``), kept apart from the table so that
its rows stay one screen each.  tests/test_grace.py holds every claim here to GRACE's formulas."""
from __future__ import annotations

from commlab.hook_row import Definition

# r = compress_ratio, n = the bucket's elements, N = ranks.  GRACE is read at commit fd3a7f4.
_K = "k = max(1, ceil(r·n))"
TOPK = Definition(
    sends=(f"each rank sends the {_K} entries of largest |x_i| of its bucket (k float32 values and k "
           "int32 indices, by allgather); the result is the mean of the ranks' sparse vectors; with "
           "sparse_error_feedback what was not sent is added to the next step's bucket (e ← x + e − sent)."),
    paper=("Stich et al. 2018 (sparsified SGD with memory): the same, error feedback on; here per DDP "
           "bucket."),
    grace=("k = max(1, int(r·n)), rounded down: one entry fewer whenever r·n is not whole; per tensor; "
           "error feedback is a memory chosen apart (its residual memory). Otherwise bit for bit equal."),
    choice=("k rounded up, so that a small bucket at a small ratio still sends its share; error "
            "feedback on by default, as in the paper."))
RANDOMK = Definition(
    sends=(f"{_K} entries drawn without replacement from a generator every rank seeds alike (the same "
           "entries on every rank), their values scaled by n/k and summed by one allreduce of k float32 "
           "values, then divided by N: unbiased, E[result] = the mean gradient. No error feedback."),
    paper=("Stich et al. 2018 use random-k with memory and without scaling; the n/k scaling is the "
           "unbiased sparsification of Wangni et al. 2018 at uniform probabilities k/n."),
    grace=("no n/k scaling: the values are sent as they are, so its mean is k/n of the gradient (biased, "
           "unless its residual memory is chosen); k = max(1, int(r·n)), rounded down; its indices come "
           "from torch.manual_seed(the tensor name's bytes summed + a step count), which reseeds torch's "
           "global generator."),
    choice=("the unbiased n/k scaling without memory: random-k as the unbiased counterpart of top-k with "
            "memory; k rounded up as top-k's; the lab's own generator, torch's global one untouched."))
THRESHOLD = Definition(
    sends=("every entry with |x_i| > τ (τ = sparsify_threshold), as float32 values and int32 indices; "
           "their number varies per rank and step, so the counts are allgathered first; with "
           "sparse_error_feedback what was not sent carries over to the next step."),
    paper=("Strom 2015 sends ±τ for each entry over the threshold (its sign and index) and keeps the "
           "remainder in the residual; the lab sends the entries' values."),
    grace="the same (|x_i| > τ, values and indices; memory chosen apart): bit for bit equal.",
    choice=("the values, as GRACE has them: 32 bits an entry more than Strom's ±τ, and no quantization "
            "error on what is sent."))
DGC = Definition(
    sends=("per bucket: local clipping to dgc_clip_norm·N^(-1/2) of its L2 norm (0 = off), momentum "
           "correction u ← m·u + g, v ← v + u (m = compressor_momentum), the exact top-k of |v| "
           f"({_K}) sent as values and indices by allgather, then momentum factor masking: the sent "
           "entries of u and v are zeroed."),
    paper=("Lin et al. 2018: the same momentum correction, factor masking and local clipping; the paper "
           "estimates the top-k threshold from a 0.1% to 1% sample and warms the sparsity up over the "
           "first epochs (no warm-up here)."),
    grace=("a threshold estimated from a random 1% sample (the smallest of its top r share of "
           "magnitudes), moved ×1.3 or ×0.7 up to ten times toward 0.7k–1.3k entries: the count varies per rank and step, not always within "
           "that (0 to 110 entries for k = 10 in 20 steps of 1,000 entries, measured); its clipping "
           "(off by default) clamps each entry to the root mean square over ranks of the tensor's norm, "
           "with an extra allreduce. With the exact k-th magnitude as its threshold, bit for bit equal."),
    choice=("the exact top-k: the same k on every rank and step, so the allgather's size is fixed and "
            "the ratio exact, at the price of a full top-k on each bucket."))
QSGD = Definition(
    sends=("the bucket's L2 norm ‖x‖ and, per entry, sign(x_i)·ξ_i, ξ_i the stochastic rounding of "
           "|x_i|/‖x‖·s to a neighbouring whole number (s = qsgd_levels), as codes of 2, 4 or 8 bits "
           "(the fewest that hold 2s+1 codes), by allgather; decoded ‖x‖·sign(x_i)·ξ_i/s: unbiased."),
    paper=("Alistarh et al. 2017: the same quantizer; the paper Elias-codes the levels and normalizes "
           "buckets of d entries (512 in its experiments); the lab a whole DDP bucket, whose larger norm "
           "gives a larger variance."),
    grace=("the same quantizer, multiplied in another order, s/‖x‖·|x_i|: the scaled value differs in its "
           "last bit, so a draw falling between the two would round apart (none did on the same draws: "
           "60,000 entries in the suite, 10,000,000 at s = 7 and at s = 127 measured); codes as int8, 8 bits an entry whatever s; its default s is 127 (the lab's 7)."),
    choice="codes packed to the fewest bits that hold them; the norm of the whole bucket as its scale.")
TERNGRAD = Definition(
    sends=("the bucket clipped to ±c·σ (c = terngrad_clip_sigmas, σ the standard deviation of its "
           "entries; 0 = no clipping), then s = max|x_i| and per entry sign(x_i)·b_i, b_i ~ "
           "Bernoulli(|x_i|/s), as 2-bit codes and s, by allgather; decoded s·sign(x_i)·b_i: unbiased "
           "for the clipped bucket."),
    paper=("Wen et al. 2017: the same ternarizing and clipping (c = 2.5); the paper ternarizes layer by "
           "layer and shares one scaler, the largest, across workers; the lab per DDP bucket, each rank "
           "its own scaler."),
    grace=("the same clipping at 2.5σ and ternarizing (bit for bit equal on the same draws), per tensor, "
           "codes as int8; a bucket with σ = 0 it clips to zero."),
    choice=("clipping on at 2.5σ by default, as in the paper (terngrad_clip_sigmas = 0 turns it off); a "
            "bucket with σ = 0 (constant, or of one entry) is not clipped, since clipping would zero it; "
            "2-bit codes."))
NATURAL = Definition(
    sends=("each entry rounded at random to a neighbouring power of two keeping its sign: |x_i| in "
           "[2^e, 2^(e+1)) goes to 2^(e+1) with probability |x_i|/2^e − 1, else to 2^e; sent as bfloat16 "
           "(16 bits, a power of two is exact there) by allgather: unbiased."),
    paper="Horváth et al. 2019: the same rounding, 9 bits an entry (sign and 8-bit exponent); here 16.",
    grace=("the same rounding, drawn on the float's mantissa bits (bit for bit equal on the same draws), "
           "8 bits an entry (sign and 7 bits of exponent): magnitudes above 2^18 are sent as 2^18, those "
           "below 2^-108 as 0; it needs cupy and a GPU."),
    choice="bfloat16 on the wire: the whole exponent range of float32 at 16 bits, no bit packing of our own.")
SIGNSGD = Definition(
    sends=("each rank sends sign(x_i) as 1 bit (x_i ≥ 0 is +1: a zero entry votes +1) by allgather; every "
           "rank takes the majority vote sign(Σ_ranks sign(x_i)), 0 on a tie (an even number of ranks); "
           "no scale: the optimizer's learning rate sets the step."),
    paper=("Bernstein et al. 2018/2019 (signSGD with majority vote): the same vote, which a parameter "
           "server broadcasts there and each rank counts here from the allgather."),
    grace="the same bits (bit for bit equal); its vote is +1 on a tie (Σ ≥ 0), the lab's 0.",
    choice="0 on a tie: an entry the ranks split on does not move.")
SIGNUM = Definition(
    sends=("each rank keeps a momentum m ← β·m + (1−β)·g from m = 0 (β = compressor_momentum) and sends "
           "sign(m) as signSGD does (1 bit, m_i ≥ 0 is +1); the majority vote, 0 on a tie."),
    paper="Bernstein et al. 2018/2019 (Signum, majority vote on the momentum): the same.",
    grace=("its momentum starts at the first gradient (m = g, then (1−β)·g + β·m), the lab's at 0, so "
           "the signs part from the second step; +1 on a tie."),
    choice="the paper's momentum from 0; the optimizer should then be plain SGD without momentum.")
EF_SIGNSGD = Definition(
    sends=("p = g + e (e what was not sent last step); each rank sends ‖p‖₁/n (one float) and sign(p) as "
           "1 bit (p_i ≥ 0 is +1) by allgather; e ← p − (‖p‖₁/n)·sign(p); the result is the mean of the "
           "ranks' decoded vectors."),
    paper=("Karimireddy et al. 2019 (EF-signSGD): p = γ·g + e, the learning rate γ inside the memory; "
           "the lab keeps it out (the optimizer applies it after), the same with plain SGD at a constant "
           "rate, not under a schedule, momentum or Adam; the paper has one worker."),
    grace=("the learning rate inside the memory as in the paper (p = e + lr·g, but p = g at a tensor's "
           "first step) and the ranks' sum divided by lr, not their mean: at lr = 1 N times the lab's "
           "result, bit for bit."),
    choice=("the learning rate out of the memory, so that the hook goes with any optimizer and schedule; "
            "the mean over ranks, as every hook returns."))
ONEBIT = Definition(
    sends=("p = g + e; each rank sends 1 bit an entry (p_i ≥ 0) and two floats, the means of p's "
           "non-negative and of its negative entries, by allgather; each entry decodes to its side's "
           "mean; e ← p − decoded; the result is the mean of the ranks' decoded vectors."),
    paper=("Seide et al. 2014 (1-bit SGD): the same quantization with error feedback, its two "
           "reconstruction values per column of each weight matrix; here per DDP bucket."),
    grace="the same with its residual memory, per tensor: bit for bit equal.",
    choice="two floats per bucket, not per column: a DDP bucket has no columns.")
