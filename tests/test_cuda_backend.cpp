// The CUDA backend against the CPU backend (the oracle), op by op, in float32, float64 and
// bfloat16, plus the caching allocator's counters on the device. Needs a GPU: without one the
// binary prints why and exits 4, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "attention_oracle.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/gpu_info.h"
#include "close_enough.h"
#include "comm/comm_nccl.h"
#include "comm/comm_threads.h"
#include "comm_conformance.h"
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "parallel/redistribute.h"

using namespace ptool;

namespace {

Backend& cpu() {
    return backend_for(Device::cpu);
}
Backend& gpu() {
    return backend_for(Device::cuda);
}

Tensor random(const Shape& s, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0) {
    CounterRng rng(seed, 7);
    Tensor t(s, dt);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(i)));
    return t;
}

Tensor ids(const Shape& s, int64_t vocab, uint64_t seed) {
    CounterRng rng(seed, 9);
    Tensor t(s, DType::int64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng.below(i, vocab));
    return t;
}

double rtol_of(DType dt) {
    return dt == DType::float64 ? 1e-12 : dt == DType::bfloat16 ? 1.6e-2 : 1e-5;
}

// cpu_result vs the GPU result copied back, elementwise (testing::close_enough); the worst
// difference reported is NaN where one side is NaN.
void expect_close(const Tensor& cpu_t, const Tensor& gpu_t, const std::string& what, double atol = 1e-5) {
    const Tensor g = gpu_t.to_device(Device::cpu);
    REQUIRE(g.shape() == cpu_t.shape());
    const double rtol = rtol_of(cpu_t.dtype());
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < cpu_t.numel(); ++i) {
        const double a = cpu_t.item(i), b = g.item(i), err = std::abs(a - b);
        if (!testing::close_enough(a, b, atol, rtol))
            ++bad, worst = std::isnan(err) || err > worst ? err : worst;
    }
    INFO(what << " in " << dtype_name(cpu_t.dtype()) << ": " << bad << " of " << cpu_t.numel()
              << " elements out of tolerance, worst " << worst);
    CHECK(bad == 0);
}

// The fused kernel's row sums l against the oracle's, each row held to the bound its bfloat16 scores
// imply (testing::bf16_row_sum_bound, attention_oracle.h).
void expect_row_sums_close(const Tensor& m, const Tensor& l, const Tensor& gpu_l, int64_t keys) {
    const Tensor g = gpu_l.to_device(Device::cpu);
    REQUIRE(g.shape() == l.shape());
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < l.numel(); ++i) {
        const double err = std::abs(l.item(i) - g.item(i)),
                     bound = testing::bf16_row_sum_bound(m.item(i), l.item(i), keys);
        if (!(err <= bound)) ++bad, worst = std::isnan(err) || err / bound > worst ? err / bound : worst;
    }
    INFO("attention_forward l (bfloat16 scores): " << bad << " of " << l.numel()
                                                   << " rows beyond the derived bound, worst at " << worst
                                                   << " x the bound");
    CHECK(bad == 0);
}

Tensor on_gpu(const Tensor& t) {
    return t.to_device(Device::cuda);
}

const DType kDtypes[] = {DType::float32, DType::float64, DType::bfloat16};

// The point-to-point failure cases' job on in-process ranks (cuda_local or nccl).
FailureLauncher launcher(const std::function<void(int n, const CommOptions&, const RankFn&)>& run_ranks) {
    FailureLauncher launch;
    launch.run = [run_ranks](double timeout, const RankFn& body) {
        CommOptions o;
        o.timeout_seconds = timeout;
        FailureRun out;
        const auto t0 = std::chrono::steady_clock::now();
        try {
            run_ranks(2, o, body);
        } catch (const RuntimeError& e) {
            out.message = e.what();
        }
        out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return out;
    };
    return launch;
}

}  // namespace

TEST_CASE("cuda gemm matches the cpu for every transpose, batch and dtype", "[cuda]") {
    for (DType dt : kDtypes)
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                const int64_t m = 33, n = 47, k = 129;
                Tensor a = random(ta ? Shape{3, k, m} : Shape{3, m, k}, dt, 1);
                Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, dt, 2);  // shared across the batch
                Tensor c = random({3, m, n}, dt, 3), gc = on_gpu(c);
                cpu().gemm(a, ta, b, tb, c, 0.5, 1.0);
                gpu().gemm(on_gpu(a), ta, on_gpu(b), tb, gc, 0.5, 1.0);
                expect_close(c, gc, fmt::format("gemm ta={} tb={}", ta, tb),
                             dt == DType::bfloat16 ? 1e-1 : 1e-4);
            }
}

TEST_CASE("cuda elementwise, activations and optimizer steps match the cpu", "[cuda]") {
    for (DType dt : kDtypes) {
        const Shape s{67, 129};
        Tensor x = random(s, dt, 4), y = random(s, dt, 5);
        Tensor gx = on_gpu(x), gy = on_gpu(y);
        for (Activation act : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu,
                               Activation::tanh}) {
            Tensor out(s, dt), gout = on_gpu(out);
            cpu().activation(act, x, out);
            gpu().activation(act, gx, gout);
            expect_close(out, gout, "activation");
            cpu().activation_backward(act, x, y, out);
            gpu().activation_backward(act, gx, gy, gout);
            expect_close(out, gout, "activation_backward");
        }
        Tensor out(s, dt), gout = on_gpu(out);
        cpu().add(x, y, out), gpu().add(gx, gy, gout), expect_close(out, gout, "add");
        cpu().mul(x, y, out), gpu().mul(gx, gy, gout), expect_close(out, gout, "mul");
        cpu().scale(x, 0.3, out), gpu().scale(gx, 0.3, gout), expect_close(out, gout, "scale");
        Tensor acc = y.clone(), gacc = on_gpu(y);
        cpu().axpy(-0.7, x, acc), gpu().axpy(-0.7, gx, gacc), expect_close(acc, gacc, "axpy");
        cpu().fill(out, 1.25), gpu().fill(gout, 1.25), expect_close(out, gout, "fill");
        Tensor bias = random({129}, dt, 6), yb = y.clone(), gyb = on_gpu(y);
        cpu().add_bias(yb, bias), gpu().add_bias(gyb, on_gpu(bias)), expect_close(yb, gyb, "add_bias");
        Tensor db = random({129}, dt, 7), gdb = on_gpu(db);
        cpu().sum_rows(x, db, true), gpu().sum_rows(gx, gdb, true);
        expect_close(db, gdb, "sum_rows", 0.0);  // the same order in double: bitwise
        CHECK(std::abs(cpu().sum_all(x) - gpu().sum_all(gx)) <= 1e-9 * std::abs(cpu().sum_all(x)) + 1e-9);
        Tensor conv(s, DType::float32), gconv = on_gpu(conv);
        cpu().copy(x, conv), gpu().copy(gx, gconv), expect_close(conv, gconv, "copy (convert)", 0.0);
        // optimizers: two steps each, momentum and weight decay on
        Tensor p = x.clone(), gp = on_gpu(x), buf(s, dt), gbuf = on_gpu(buf);
        for (int step = 1; step <= 2; ++step) {
            cpu().sgd_step(p, y, buf, 0.1, 0.9, 0.01, step == 1);
            gpu().sgd_step(gp, gy, gbuf, 0.1, 0.9, 0.01, step == 1);
        }
        expect_close(p, gp, "sgd_step");
        Tensor q = x.clone(), gq = on_gpu(x), m(s, dt), v(s, dt), gm = on_gpu(m), gv = on_gpu(v);
        for (int step = 1; step <= 2; ++step) {
            cpu().adamw_step(q, y, m, v, step, 1e-3, 0.9, 0.999, 1e-8, 0.01);
            gpu().adamw_step(gq, gy, gm, gv, step, 1e-3, 0.9, 0.999, 1e-8, 0.01);
        }
        expect_close(q, gq, "adamw_step");
        expect_close(v, gv, "adamw exp_avg_sq");
    }
}

TEST_CASE("cuda norms match the cpu (layer, rms, batch, forward and backward)", "[cuda]") {
    for (DType dt : kDtypes) {
        const DType sd = dt == DType::float64 ? DType::float64 : DType::float32;
        for (bool rms : {false, true}) {
            const int64_t rows = 37, d = 1500;  // d > 1024: threads loop within the row
            Tensor x = random({rows, d}, dt, 8), w = random({d}, dt, 9), b = random({d}, dt, 10);
            Tensor y({rows, d}, dt), mean({rows}, sd), rstd({rows}, sd);
            Tensor gx = on_gpu(x), gw = on_gpu(w), gb = on_gpu(b), gy = on_gpu(y), gmean = on_gpu(mean),
                   grstd = on_gpu(rstd);
            cpu().layer_norm(x, w, b, 1e-5, rms, y, mean, rstd);
            gpu().layer_norm(gx, gw, gb, 1e-5, rms, gy, gmean, grstd);
            expect_close(y, gy, rms ? "rms_norm" : "layer_norm");
            expect_close(rstd, grstd, "layer_norm rstd");
            Tensor dy = random({rows, d}, dt, 11), dx({rows, d}, dt), dw(w.shape(), dt), dbias(b.shape(), dt);
            Tensor gdx = on_gpu(dx), gdw = on_gpu(dw), gdbias = on_gpu(dbias);
            cpu().layer_norm_backward(x, w, mean, rstd, dy, rms, dx, &dw, &dbias);
            gpu().layer_norm_backward(gx, gw, gmean, grstd, on_gpu(dy), rms, gdx, &gdw, &gdbias);
            expect_close(dx, gdx, "layer_norm_backward dx");
            expect_close(dw, gdw, "layer_norm_backward dw", 1e-4);
            expect_close(dbias, gdbias, "layer_norm_backward db", 1e-4);
        }
        const int64_t n = 64, c = 33;
        Tensor x = random({n, c}, dt, 12), mean({c}, sd), var({c}, sd), gmean = on_gpu(mean),
               gvar = on_gpu(var);
        Tensor gx = on_gpu(x);
        cpu().channel_moments(x, mean, var), gpu().channel_moments(gx, gmean, gvar);
        expect_close(mean, gmean, "channel_moments mean", 0.0);
        expect_close(var, gvar, "channel_moments var", 0.0);
        Tensor rstd({c}, sd);
        for (int64_t j = 0; j < c; ++j) rstd.set(j, 1.0 / std::sqrt(var.item(j) + 1e-5));
        Tensor grstd = on_gpu(rstd), w = random({c}, dt, 13), b = random({c}, dt, 14), y({n, c}, dt),
               gy = on_gpu(y);
        cpu().batch_norm_apply(x, mean, rstd, w, b, y);
        gpu().batch_norm_apply(gx, gmean, grstd, on_gpu(w), on_gpu(b), gy);
        expect_close(y, gy, "batch_norm_apply");
        Tensor dy = random({n, c}, dt, 15), s1({c}, sd), s2({c}, sd), gs1 = on_gpu(s1), gs2 = on_gpu(s2);
        cpu().batch_norm_grad_sums(x, mean, rstd, dy, s1, s2);
        gpu().batch_norm_grad_sums(gx, gmean, grstd, on_gpu(dy), gs1, gs2);
        expect_close(s1, gs1, "batch_norm_grad_sums", 1e-9);
        expect_close(s2, gs2, "batch_norm_grad_sums xhat", 1e-9);
        Tensor dx({n, c}, dt), gdx = on_gpu(dx);
        cpu().batch_norm_backward_input(x, mean, rstd, w, dy, s1, s2, n, dx);
        gpu().batch_norm_backward_input(gx, gmean, grstd, on_gpu(w), on_gpu(dy), gs1, gs2, n, gdx);
        expect_close(dx, gdx, "batch_norm_backward_input");
    }
}

TEST_CASE("cuda embedding, attention helpers and losses match the cpu", "[cuda]") {
    for (DType dt : kDtypes) {
        Tensor w = random({50, 24}, dt, 16), tok = ids({4, 9}, 50, 17);
        tok.data<int64_t>()[3] = -1;  // another rank's row
        Tensor y({4, 9, 24}, dt), gy = on_gpu(y);
        cpu().embedding(tok, w, y), gpu().embedding(on_gpu(tok), on_gpu(w), gy);
        expect_close(y, gy, "embedding", 0.0);
        Tensor dy = random({4, 9, 24}, dt, 18), dw = random({50, 24}, dt, 19), gdw = on_gpu(dw);
        cpu().embedding_backward(tok, dy, dw), gpu().embedding_backward(on_gpu(tok), on_gpu(dy), gdw);
        expect_close(dw, gdw, "embedding_backward", 0.0);  // same order, same rounding
        Tensor bad = tok.clone();
        bad.data<int64_t>()[5] = 50;
        CHECK_THROWS_WITH(gpu().embedding(on_gpu(bad), on_gpu(w), gy),
                          Catch::Contains("token id 50 at position 5"));

        Tensor x = random({2, 3, 5, 7}, dt, 20), t({2, 5, 3, 7}, dt), gt = on_gpu(t);
        cpu().transpose12(x, t), gpu().transpose12(on_gpu(x), gt), expect_close(t, gt, "transpose12", 0.0);
        for (bool causal : {false, true}) {
            Tensor s = random({2, 3, 6, 9}, dt, 21), p(s.shape(), dt), gp = on_gpu(p);
            cpu().softmax(s, causal, p), gpu().softmax(on_gpu(s), causal, gp), expect_close(p, gp, "softmax");
            Tensor d = random(s.shape(), dt, 22), dx(s.shape(), dt), gdx = on_gpu(dx);
            cpu().softmax_backward(p, d, dx), gpu().softmax_backward(on_gpu(p), on_gpu(d), gdx);
            expect_close(dx, gdx, "softmax_backward");
        }
        {  // the ring's blocked softmax (one row of all -inf: the statistics of a fully masked block)
            Tensor s = random({6, 9}, dt, 27), v = random({6, 4}, dt, 28), p(s.shape(), dt), gp = on_gpu(p);
            for (int64_t j = 0; j < 9; ++j) s.set(2 * 9 + j, -INFINITY);
            const DType st = acc_dtype(dt);
            Tensor m({6}, st), l({6}, st), gm = on_gpu(m), gl = on_gpu(l);
            cpu().softmax_stats(s, p, m, l), gpu().softmax_stats(on_gpu(s), gp, gm, gl);
            expect_close(p, gp, "softmax_stats"), expect_close(m, gm, "softmax_stats m"),
                expect_close(l, gl, "softmax_stats l");
            Tensor o = random({6, 4}, dt, 29), ob = random({6, 4}, dt, 30), m2 = random({6}, st, 31),
                   l2 = random({6}, st, 32, 0.5, 2.0), go = on_gpu(o), gm2 = on_gpu(m2), gl2 = on_gpu(l2);
            cpu().softmax_merge(o, m2, l2, ob, m, l), gpu().softmax_merge(go, gm2, gl2, on_gpu(ob), gm, gl);
            expect_close(o, go, "softmax_merge"), expect_close(m2, gm2, "softmax_merge m"),
                expect_close(l2, gl2, "softmax_merge l");
            Tensor q(s.shape(), dt), gq = on_gpu(q);
            cpu().softmax_from_stats(s, m2, l2, q), gpu().softmax_from_stats(on_gpu(s), gm2, gl2, gq);
            expect_close(q, gq, "softmax_from_stats");
            Tensor dp = random(s.shape(), dt, 33), d_o = random({6, 4}, dt, 34), ds(s.shape(), dt),
                   gds = on_gpu(ds);
            cpu().softmax_backward_rows(q, dp, o, d_o, ds);
            gpu().softmax_backward_rows(gq, on_gpu(dp), go, on_gpu(d_o), gds);
            expect_close(ds, gds, "softmax_backward_rows");
            (void)v;
        }
        // the 12 valid rows' mean (reduction='mean'), and their sum over a step's count (global_tokens)
        for (const double divisor : {12.0, 40.0}) {
            Tensor logits = random({13, 2000}, dt, 23), target = ids({13}, 2000, 24), dl(logits.shape(), dt),
                   gdl = on_gpu(dl);
            target.data<int64_t>()[2] = -100;  // ignore_index
            const double l_cpu = cpu().cross_entropy(logits, target, -100, divisor, dl);
            const double l_gpu = gpu().cross_entropy(on_gpu(logits), on_gpu(target), -100, divisor, gdl);
            CHECK(std::abs(l_cpu - l_gpu) <= rtol_of(dt) * std::abs(l_cpu));
            expect_close(dl, gdl, "cross_entropy dlogits");
            Tensor o = random({31, 17}, dt, 25), tg = random({31, 17}, dt, 26), dout(o.shape(), dt),
                   gdout = on_gpu(dout);
            const double m_cpu = cpu().mse(o, tg, divisor, dout),
                         m_gpu = gpu().mse(on_gpu(o), on_gpu(tg), divisor, gdout);
            CHECK(std::abs(m_cpu - m_gpu) <= rtol_of(dt) * std::abs(m_cpu));
            expect_close(dout, gdout, "mse dout");
        }
    }
}

TEST_CASE("cuda gated_activation and its backward match the cpu", "[cuda]") {
    for (DType dt : kDtypes)
        for (Activation act : {Activation::silu, Activation::gelu, Activation::gelu_tanh}) {
            const Shape s{67, 129};
            const Tensor g = random(s, dt, 60), u = random(s, dt, 61), dh = random(s, dt, 62);
            Tensor a(s, dt), h(s, dt), du(s, dt), dg(s, dt);
            Tensor ga = on_gpu(a), gh = on_gpu(h), gdu = on_gpu(du), gdg = on_gpu(dg);
            cpu().gated_activation(act, g, u, a, h);
            gpu().gated_activation(act, on_gpu(g), on_gpu(u), ga, gh);
            expect_close(a, ga, "gated_activation a"), expect_close(h, gh, "gated_activation h");
            cpu().gated_activation_backward(act, g, a, u, dh, du, dg);
            gpu().gated_activation_backward(act, on_gpu(g), ga, on_gpu(u), on_gpu(dh), gdu, gdg);
            expect_close(du, gdu, "gated_activation_backward du"),
                expect_close(dg, gdg, "gated_activation_backward dg");
        }
}

// Initialisation drawn on the device (cuda_init_draw.cu: uniform by a kernel, normal on the host's
// cores and copied) bitwise the CPU's draw, whole and as shards along each dim, in every dtype.
TEST_CASE("cuda draw_init is bitwise the cpu's draw", "[cuda]") {
    struct Shard {
        Shape local;
        int64_t run, full_len, inner, offset;
    };
    const Shard shards[] = {
        {{1000003}, 1000003, 1000003, 1, 0},        // whole
        {{517, 513}, 513, 1031, 1, 401},            // a column shard of [517, 1031]
        {{259, 1033}, 259 * 1033, 777, 1033, 259},  // a row shard of [777, 1033]
    };
    for (DType dt : kDtypes)
        for (const Shard& sh : shards)
            for (bool normal : {false, true}) {
                InitDraw d;
                d.seed = 20261128, d.stream = stream_id("init", "layers.0.weight"), d.normal = normal;
                d.scale = normal ? 0.02 : 0.03125, d.run = sh.run, d.full_len = sh.full_len,
                d.inner = sh.inner, d.offset = sh.offset;
                Tensor host = Tensor::empty(sh.local, dt), dev = Tensor::empty(sh.local, dt, Device::cuda);
                cpu().draw_init(host, d);
                gpu().draw_init(dev, d);
                const Tensor back = dev.to_device(Device::cpu);
                INFO(dtype_name(dt) << " " << shape_str(sh.local) << (normal ? " normal" : " uniform"));
                CHECK(std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0);
            }
}

// The fused kernels (cuda_flash_attention.cu) against the CPU's tile semantics (attention_oracle.h):
// grouped and plain heads, causal and not, o in both layouts, a ring block's positions (one query
// that sees no key: m -inf, l 0, o and its gradients 0), head dims that fill 2, 4 and 8 dims a lane
// and leave lanes idle, sequences over several row and column blocks with short last ones. The
// oracle rounds the scores and probabilities to the dtype as the tile path's gemm and softmax do;
// the kernels keep them in float: bfloat16 compares at a few of its ulps.
TEST_CASE("cuda fused attention matches the cpu's tile semantics, forward and backward", "[cuda]") {
    struct Case {
        int64_t b, heads, kv, t, s, hd;
        bool causal, merged, positions;
    };
    const Case cases[] = {
        {2, 4, 2, 200, 200, 64, true, true, false},  // llama-like: grouped, causal, two row tiles
        {1, 3, 3, 37, 37, 80, false, false, false},  // plain heads, not causal, hd 80 (4 a lane, 16 idle)
        {2, 4, 1, 70, 150, 32, true, false, true},   // a ring block: queries and keys by position
        {1, 2, 2, 33, 65, 256, true, true, false},   // hd 256; more keys than queries (offset S - T)
        {1, 1, 1, 5, 7, 6, true, false, false},      // a tiny head: one short block each way
    };
    for (DType dt : kDtypes)
        for (const Case& c : cases) {
            if (!gpu().fused_attention(dt, c.hd))
                continue;  // float64 at hd 256: its tiles exceed shared memory
            INFO(dtype_name(dt) << " b " << c.b << " heads " << c.heads << "/" << c.kv << " t " << c.t
                                << " s " << c.s << " hd " << c.hd);
            AttentionArgs a;
            a.batch = c.b, a.heads = c.heads, a.kv_heads = c.kv, a.causal = c.causal;
            a.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
            if (c.positions) {  // queries at 3i + 40 (the first before every key), keys at 2j + 41
                Tensor qp({c.t}, DType::int64), kp({c.s}, DType::int64);
                for (int64_t i = 0; i < c.t; ++i) qp.data<int64_t>()[i] = 3 * i + 40;
                for (int64_t j = 0; j < c.s; ++j) kp.data<int64_t>()[j] = 2 * j + 41;
                a.query_pos = qp, a.key_pos = kp;
            }
            AttentionArgs ga = a;
            ga.o_merged = c.merged;
            if (c.positions) ga.query_pos = on_gpu(a.query_pos), ga.key_pos = on_gpu(a.key_pos);
            const int64_t n = c.b * c.heads;
            const Tensor q = random({n, c.t, c.hd}, dt, 40), k = random({c.b * c.kv, c.s, c.hd}, dt, 41),
                         v = random({c.b * c.kv, c.s, c.hd}, dt, 42), d_o = random({n, c.t, c.hd}, dt, 43);
            const DType st = acc_dtype(dt);
            Tensor o({n, c.t, c.hd}, dt), m({n, c.t}, st), l({n, c.t}, st);
            testing::oracle_forward(cpu(), a, q, k, v, o, m, l);
            Tensor go = c.merged ? Tensor({c.b, c.t, c.heads * c.hd}, dt, Device::cuda) : on_gpu(o),
                   gm = on_gpu(m), gl = on_gpu(l);
            const Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v);
            gpu().attention_forward(ga, gq, gk, gv, go, gm, gl);
            const double atol = dt == DType::bfloat16 ? 5e-2 : 1e-5,
                         gtol = dt == DType::bfloat16 ? 1e-1 : 1e-4;
            const Tensor go_split =
                c.merged ? testing::split_layout(cpu(), go.to_device(Device::cpu), c.b, c.heads) : go;
            expect_close(o, go_split, "attention_forward o", atol);
            expect_close(m, gm, "attention_forward m", atol);
            if (dt == DType::bfloat16)
                expect_row_sums_close(m, l, gl, c.s);
            else
                expect_close(l, gl, "attention_forward l", gtol);
            Tensor dq = random({n, c.t, c.hd}, dt, 44), dk({c.b * c.kv, c.s, c.hd}, dt), dv(dk.shape(), dt);
            Tensor gdq = on_gpu(dq), gdk = on_gpu(dk), gdv = on_gpu(dv);
            testing::oracle_backward(cpu(), a, q, k, v, o, d_o, m, l, dq, dk, dv, true);
            const Tensor gd_o =
                c.merged ? on_gpu(testing::merged_layout(cpu(), d_o, c.b, c.heads)) : on_gpu(d_o);
            gpu().attention_backward(ga, gq, gk, gv, go, gd_o, gm, gl, gdq, gdk, gdv, true);
            expect_close(dq, gdq, "attention_backward dq (accumulated)", gtol);
            expect_close(dk, gdk, "attention_backward dk", gtol);
            expect_close(dv, gdv, "attention_backward dv", gtol);
        }
}

TEST_CASE("cuda fused attention is bitwise the same run to run", "[cuda]") {
    AttentionArgs a;
    a.batch = 2, a.heads = 4, a.kv_heads = 2, a.causal = true, a.scale = 0.125, a.o_merged = true;
    const Tensor q = on_gpu(random({8, 300, 64}, DType::float32, 50)),
                 k = on_gpu(random({4, 300, 64}, DType::float32, 51)),
                 v = on_gpu(random({4, 300, 64}, DType::float32, 52)),
                 d_o = on_gpu(random({2, 300, 256}, DType::float32, 53));
    std::vector<std::vector<double>> runs;
    for (int r = 0; r < 2; ++r) {
        Tensor o({2, 300, 256}, DType::float32, Device::cuda), m({8, 300}, DType::float32, Device::cuda),
            l({8, 300}, DType::float32, Device::cuda), dq({8, 300, 64}, DType::float32, Device::cuda),
            dk({4, 300, 64}, DType::float32, Device::cuda), dv({4, 300, 64}, DType::float32, Device::cuda);
        gpu().attention_forward(a, q, k, v, o, m, l);
        gpu().attention_backward(a, q, k, v, o, d_o, m, l, dq, dk, dv, false);
        std::vector<double> all;
        for (const Tensor* t : {&o, &dq, &dk, &dv})
            for (double x : t->to_device(Device::cpu).to_doubles()) all.push_back(x);
        runs.push_back(all);
    }
    CHECK(runs[0] == runs[1]);
}

TEST_CASE("cuda tensors: copies, views and the caching allocator's counters", "[cuda]") {
    const AllocatorStats before = cuda_memory_stats();
    {
        Tensor h = random({64, 30}, DType::float32, 27);
        Tensor g = on_gpu(h);
        CHECK(cuda_memory_stats().in_use >= before.in_use + 64 * 30 * 4);
        CHECK(g.narrow(1, 5, 10).to_device(Device::cpu).to_doubles() == h.narrow(1, 5, 10).to_doubles());
        CHECK(g.narrow(0, 3, 4).item(7) == h.narrow(0, 3, 4).item(7));
        g.set(11, 42.0);
        CHECK(g.item(11) == 42.0);
        CHECK(g.to(DType::float64).to_device(Device::cpu).item(0) == h.item(0));
    }
    const AllocatorStats after = cuda_memory_stats();
    CHECK(after.in_use == before.in_use);  // every block came back
    CHECK(after.peak_in_use >= before.in_use + 64 * 30 * 4);
}

TEST_CASE("cuda_local passes the communicator conformance suite at world sizes 1 to 8", "[cuda]") {
    for (int n = 1; n <= 8; ++n) {
        const auto [report, name] = run_conformance_on_ranks(
            [&](const RankFn& fn) {
                run_rank_threads(
                    n, CommOptions{},
                    [&](Communicator& comm) {
                        gpu();  // this rank thread: the device and its own stream
                        fn(comm);
                    },
                    Device::cuda);
            },
            Device::cuda);
        INFO("world size " << n << ": " << (report.failures.empty() ? "" : report.failures[0]));
        CHECK(report.failed == 0);
        CHECK(report.passed > 0);
        CHECK(name == "cuda_local");
    }
}

TEST_CASE(
    "cuda_local point-to-point failures end every rank within the timeout, naming both ranks and the tag",
    "[cuda]") {
    ConformanceReport rep;
    run_p2p_failure_conformance(launcher([](int n, const CommOptions& o, const RankFn& body) {
                                    run_rank_threads(
                                        n, o,
                                        [&](Communicator& c) {
                                            gpu();
                                            body(c);
                                        },
                                        Device::cuda);
                                }),
                                rep, Device::cuda);
    INFO((rep.failures.empty() ? "" : rep.failures[0]));
    CHECK(rep.failed == 0);
    CHECK(rep.passed == 6);
}

TEST_CASE("cuda_local redistributes shards of any dim on the device, bitwise the host's", "[cuda]") {
    // shards of dims other than 0 travel packed (pack_chunks): strided device copies, no host trip
    for (const Shape& shape : {Shape{5, 7, 3}, Shape{4, 6}})
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
            for (int n : {2, 3}) {
                INFO("shape " << shape_str(shape) << " dim " << d << " world size " << n);
                const Tensor full = random(shape, DType::float32, 51);
                std::vector<int> gathered(n, 0), scattered(n, 0);
                run_rank_threads(
                    n, CommOptions{},
                    [&](Communicator& c) {
                        gpu();
                        const Tensor local = on_gpu(chunk(full, n, c.rank(), d));
                        const Tensor g = full_tensor(local, Placement::shard(d), shape, c);
                        gathered[c.rank()] = g.device() == Device::cuda &&
                                             g.to_device(Device::cpu).to_doubles() == full.to_doubles();
                        const Tensor mine =
                            redistribute(on_gpu(full), Placement::partial(), Placement::shard(d), shape, c);
                        Tensor sum = full.clone();
                        cpu().scale(full, static_cast<double>(n),
                                    sum);  // n equal summands: fl(n x) either way
                        scattered[c.rank()] = mine.to_device(Device::cpu).to_doubles() ==
                                              chunk(sum, n, c.rank(), d).to_doubles();
                    },
                    Device::cuda);
                for (int r = 0; r < n; ++r) {
                    CHECK(gathered[r] == 1);
                    CHECK(scattered[r] == 1);
                }
            }
}

// nccl at world size 1 runs on every GPU machine; sizes 2..8 where the machine has the GPUs.
TEST_CASE("nccl passes the communicator conformance suite on one GPU per rank", "[cuda]") {
    const int gpus = static_cast<int>(query_gpus().devices.size());
    for (int n = 1; n <= std::min(gpus, 8); ++n) {
        const auto [report, name] = run_conformance_on_ranks(
            [&](const RankFn& fn) { run_nccl_threads(n, CommOptions{}, fn); }, Device::cuda);
        INFO("world size " << n << ": " << (report.failures.empty() ? "" : report.failures[0]));
        CHECK(report.failed == 0);
        CHECK(report.passed > 0);
        CHECK(name == "nccl");
    }
}

TEST_CASE("nccl: host tensors are staged through the device, results bitwise the threads communicator's",
          "[cuda]") {
    Tensor t = random({37, 5}, DType::float32, 41);
    Tensor on_threads = t.clone(), on_nccl = t.clone();
    run_rank_threads(1, CommOptions{}, [&](Communicator& c) { c.all_reduce(on_threads, ReduceOp::avg); });
    run_nccl_threads(1, CommOptions{}, [&](Communicator& c) { c.all_reduce(on_nccl, ReduceOp::avg); });
    CHECK(on_nccl.device() == Device::cpu);
    CHECK(on_nccl.to_doubles() == on_threads.to_doubles());
}

// Failure paths need two ranks, so two GPUs; a one-GPU machine reports the case as not run.
TEST_CASE("a nccl rank that never arrives times out on every rank, a mismatch is named", "[cuda]") {
    if (query_gpus().devices.size() < 2) {
        WARN("needs 2 GPUs: not run on this machine");
        return;
    }
    CommOptions quick;
    quick.timeout_seconds = 1;
    CHECK_THROWS_WITH(run_nccl_threads(2, quick,
                                       [&](Communicator& c) {
                                           Tensor x = Tensor({4}, DType::float32, Device::cuda);
                                           if (c.rank() == 1)
                                               c.all_reduce(x, ReduceOp::sum);
                                           else
                                               std::this_thread::sleep_for(
                                                   std::chrono::seconds(3));  // rank 0 never arrives
                                       }),
                      Catch::Contains("rank 1 timed out after 1 s in all_reduce#0"));
    CHECK_THROWS_WITH(
        run_nccl_threads(2, CommOptions{},
                         [&](Communicator& c) {
                             Tensor x = Tensor({4 + c.rank()}, DType::float32, Device::cuda);
                             c.all_reduce(x, ReduceOp::sum);
                         }),
        Catch::Contains(
            "collective mismatch: rank 1 all_reduce#0 float32 [5] vs rank 0 all_reduce#0 float32 [4]"));
}

TEST_CASE("nccl point-to-point failures end every rank within the timeout, naming both ranks and the tag",
          "[cuda]") {
    if (query_gpus().devices.size() < 2) {
        WARN("needs 2 GPUs: not run on this machine");
        return;
    }
    ConformanceReport rep;
    run_p2p_failure_conformance(
        launcher([](int n, const CommOptions& o, const RankFn& body) { run_nccl_threads(n, o, body); }), rep,
        Device::cuda);
    INFO((rep.failures.empty() ? "" : rep.failures[0]));
    CHECK(rep.failed == 0);
    CHECK(rep.passed == 6);
}

int main(int argc, char** argv) {
    const GpuInfo info = query_gpus();
    if (info.devices.empty()) {
        std::printf("SKIP: the CUDA backend tests need a GPU: %s\n", info.why_none.c_str());
        return 4;
    }
    backend_for(Device::cuda);  // selects the CUDA backend, as --device cuda does: device tensors need it
    return Catch::Session().run(argc, argv);
}
