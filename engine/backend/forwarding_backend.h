// A Backend that hands every op to another: the base of a backend that changes one op and keeps
// the rest (verify/faults.cpp's cp_merge_unscaled). Every op of Backend is here, so a new op that
// is not fails to compile where one of these is made.
#pragma once

#include <string>

#include "backend/backend.h"

namespace ptool {

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
    Device device() const override { return inner_.device(); }
    std::string name() const override { return inner_.name(); }
    void synchronize() override { inner_.synchronize(); }
    void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
              double beta) override {
        inner_.gemm(a, trans_a, b, trans_b, c, alpha, beta);
    }
    void activation(Activation act, const Tensor& x, Tensor& y) override { inner_.activation(act, x, y); }
    void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) override {
        inner_.activation_backward(act, x, dy, dx);
    }
    void add(const Tensor& a, const Tensor& b, Tensor& out) override { inner_.add(a, b, out); }
    void mul(const Tensor& a, const Tensor& b, Tensor& out) override { inner_.mul(a, b, out); }
    void axpy(double alpha, const Tensor& x, Tensor& y) override { inner_.axpy(alpha, x, y); }
    void scale(const Tensor& x, double s, Tensor& out) override { inner_.scale(x, s, out); }
    void fill(Tensor& t, double value) override { inner_.fill(t, value); }
    void gated_activation(Activation act, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) override {
        inner_.gated_activation(act, g, u, a, h);
    }
    void gated_activation_backward(Activation act, const Tensor& g, const Tensor& a, const Tensor& u,
                                   const Tensor& dh, Tensor& du, Tensor& dg) override {
        inner_.gated_activation_backward(act, g, a, u, dh, du, dg);
    }
    void copy(const Tensor& src, Tensor& dst) override { inner_.copy(src, dst); }
    void add_bias(Tensor& y, const Tensor& bias) override { inner_.add_bias(y, bias); }
    void sum_rows(const Tensor& dy, Tensor& db, bool acc) override { inner_.sum_rows(dy, db, acc); }
    double sum_all(const Tensor& x) override { return inner_.sum_all(x); }
    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms, Tensor& y,
                    Tensor& mean, Tensor& rstd) override {
        inner_.layer_norm(x, w, b, eps, rms, y, mean, rstd);
    }
    void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, bool rms, Tensor& dx, Tensor* dw, Tensor* db) override {
        inner_.layer_norm_backward(x, w, mean, rstd, dy, rms, dx, dw, db);
    }
    void channel_moments(const Tensor& x, Tensor& mean, Tensor& var) override {
        inner_.channel_moments(x, mean, var);
    }
    void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                          const Tensor& b, Tensor& y) override {
        inner_.batch_norm_apply(x, mean, rstd, w, b, y);
    }
    void batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                              Tensor& sum_dy, Tensor& sum_dy_xhat) override {
        inner_.batch_norm_grad_sums(x, mean, rstd, dy, sum_dy, sum_dy_xhat);
    }
    void batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                   const Tensor& dy, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                                   double count, Tensor& dx) override {
        inner_.batch_norm_backward_input(x, mean, rstd, w, dy, sum_dy, sum_dy_xhat, count, dx);
    }
    void embedding(const Tensor& ids, const Tensor& w, Tensor& y) override { inner_.embedding(ids, w, y); }
    void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) override {
        inner_.embedding_backward(ids, dy, dw);
    }
    void transpose12(const Tensor& x, Tensor& y) override { inner_.transpose12(x, y); }
    void softmax(const Tensor& x, bool causal, Tensor& y) override { inner_.softmax(x, causal, y); }
    void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
        inner_.softmax_backward(y, dy, dx);
    }
    void softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) override {
        inner_.softmax_stats(x, y, m, l);
    }
    void softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                       const Tensor& l_b) override {
        inner_.softmax_merge(o, m, l, o_b, m_b, l_b);
    }
    void softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) override {
        inner_.softmax_from_stats(x, m, l, y);
    }
    void softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                               Tensor& dx) override {
        inner_.softmax_backward_rows(y, dy, o, d_o, dx);
    }
    void draw_init(Tensor& t, const InitDraw& d) override { inner_.draw_init(t, d); }
    bool fused_attention(DType dt, int64_t head_dim) const override {
        return inner_.fused_attention(dt, head_dim);
    }
    void attention_forward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                           Tensor& o, Tensor& m, Tensor& l) override {
        inner_.attention_forward(a, q, k, v, o, m, l);
    }
    void attention_backward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& o, const Tensor& d_o, const Tensor& m, const Tensor& l, Tensor& dq,
                            Tensor& dk, Tensor& dv, bool accumulate_dq) override {
        inner_.attention_backward(a, q, k, v, o, d_o, m, l, dq, dk, dv, accumulate_dq);
    }
    double cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double divisor,
                         Tensor& dlogits) override {
        return inner_.cross_entropy(logits, target, ignore_index, divisor, dlogits);
    }
    double mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) override {
        return inner_.mse(out, target, divisor, dout);
    }
    void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buf, double lr, double momentum,
                  double weight_decay, bool first_step) override {
        inner_.sgd_step(p, g, momentum_buf, lr, momentum, weight_decay, first_step);
    }
    void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step, double lr,
                    double beta1, double beta2, double eps, double weight_decay) override {
        inner_.adamw_step(p, g, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay);
    }

protected:
    Backend& inner_;
};

}  // namespace ptool
