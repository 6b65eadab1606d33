// Text made only when someone reads it. Error messages and a form's reasons are for the rare call
// that fails or is explained, so the hot path passes their pieces around unrendered: text that is
// already there (a literal, a name) as a view, text that must be made (a mechanism's canonical
// form, a reason with numbers in it) as a callable returning std::string, called by str().
//
//   n = checked_mul(n, d, [&] { return "attend: params['" + name + "'] element count"; });
//   why.push_back([&] { return std::to_string(p.N) + " tokens > " + std::to_string(kMax); });
//   core::check_params(opt.params, specs, core::mechanism_text(m), symbols);  // core/io_checks.hpp
//
// A LazyText refers to its text or callable without copying it: take it as a parameter (or pass
// it on), never keep one beyond the call that received it.
#pragma once
#include <string>
#include <string_view>
#include <type_traits>

namespace attn {

class LazyText {
 public:
  template <class S>
    requires std::is_convertible_v<const S&, std::string_view>
  LazyText(const S& text) : text_(text) {}  // NOLINT: implicit, as a string parameter is

  template <class F>
    requires(!std::is_convertible_v<const F&, std::string_view> && std::is_invocable_r_v<std::string, const F&>)
  LazyText(const F& make)  // NOLINT: implicit, so a lambda passes where text is expected
      : make_(&make), render_([](const void* f) -> std::string { return (*static_cast<const F*>(f))(); }) {}

  std::string str() const { return render_ ? render_(make_) : std::string(text_); }

 private:
  std::string_view text_;
  const void* make_ = nullptr;
  std::string (*render_)(const void*) = nullptr;
};

}  // namespace attn
