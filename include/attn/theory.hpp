// How concentrated attention can be in the limit of many keys: keys k ~ N(mu, sigma^2 I),
// a query q, beta = q.mu, gamma = sigma ||q||, so a score is beta + gamma eps with eps ~ N(0, 1)
// and a row of n -> infinity weights f(score) has sparsity
//   S = E|f(beta + gamma eps)| / sqrt(E[f(beta + gamma eps)^2]).
// Closed forms (each checked against quadrature and Monte Carlo in tests):
#pragma once
#include <cstdint>
#include <vector>

namespace attn::theory {

// f = exp (softmax): exp(-gamma^2 / 2), whatever beta: arbitrarily sparse as gamma grows.
double sparsity_exp(double beta, double gamma);
// f = relu^2 (GAU), through its moments with Phi written by erfc, so no 1 + erf(u) cancels:
// depends on t = beta / gamma alone (1/sqrt(6) at t = 0), -> 0 only for t -> -infinity.
double sparsity_relu2(double beta, double gamma);
// The same value typed with 1 + erf(u) in place of erfc(-u): kept to show where
// it breaks (t below about -6 it loses every digit, near -8 it is NaN). Do not use.
double sparsity_relu2_erf_form(double beta, double gamma);
// f = identity (plain linear attention): (sqrt(2/pi) gamma e^(-beta^2/(2 gamma^2)) +
// beta erf(beta/(sqrt(2) gamma))) / sqrt(beta^2 + gamma^2): even in beta, >= sqrt(2/pi) at
// beta = 0, bounded away from 0.
double sparsity_identity(double beta, double gamma);
// A non-negative feature map, weights q~.k~_j: 1 / sqrt(1 + q~' Sigma q~ / (q~' mu~)^2) with the
// feature-mapped keys' mean mu~ (d) and covariance Sigma (d x d, row-major).
double sparsity_linear(const std::vector<double>& q, const std::vector<double>& mu, const std::vector<double>& sigma);
// Its i.i.d. case (components of mean mu~, deviation sigma~): 1 / sqrt(1 + (r ||q~||_2 / ||q~||_1)^2),
// r = sigma~ / mu~.
double sparsity_linear_iid(const std::vector<double>& q, double mean, double deviation);
// Pure decay row (lambda^(n-1), ..., lambda, 1): sqrt((1 - l^n) / (n (1 - l)) (1 + l) / (1 + l^n)).
double sparsity_decay(double lambda, int64_t n);

}  // namespace attn::theory
