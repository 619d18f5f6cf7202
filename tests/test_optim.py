import torch

from arbench.optim import can_fuse, make_adamw


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=gen)),
            torch.nn.Parameter(torch.randn(3, generator=gen))]


def test_fused_update_matches_the_loop():
    # the fused kernel and torch's per-tensor loop take the same three steps
    fused, loop = _params(0), _params(0)
    groups = [{"params": fused[:1], "weight_decay": 0.1}, {"params": fused[1:], "weight_decay": 0.0}]
    opt_f = make_adamw(groups, lr=1e-2, betas=(0.9, 0.98))
    opt_l = torch.optim.AdamW([{"params": loop[:1], "weight_decay": 0.1},
                               {"params": loop[1:], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.98), foreach=False)
    assert opt_f.defaults["fused"] is True
    for step in range(3):
        grads = _params(step + 10)
        for ps in (fused, loop):
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.detach().clone()
        opt_f.step(), opt_l.step()
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b)


def test_fusing_is_skipped_where_it_cannot_run():
    assert not can_fuse([])
    assert not can_fuse([torch.zeros(3, dtype=torch.int64)])
    opt = make_adamw(_params(0), allow_fused=False, lr=1e-3)
    assert not opt.defaults.get("fused")
