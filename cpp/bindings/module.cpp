#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "stockade._core: the compiled engine. Use the typed API of the `stockade` package; this "
      "module is its implementation and may change between releases.";
  m.attr("__version__") = stockade::library_version();
  stockade::bindings::register_errors(m);
  stockade::bindings::register_types(m);
  stockade::bindings::register_options(m);
  auto engine = stockade::bindings::register_engine(m);
  stockade::bindings::register_calls(engine);
  stockade::bindings::register_stats(engine);
  stockade::bindings::register_async(m, engine);
  stockade::bindings::register_record(m, engine);
  stockade::bindings::register_testing(m);
}
