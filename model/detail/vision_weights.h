// Shared by the vision encoder readers (model/vision.cc for mmproj GGUFs, model/hf_vision.cc for
// Hugging Face directories).
#pragma once

#include <memory>
#include <vector>

#include "model/model_spec.h"

namespace troupe::model::detail {

/// The float matrix w (F32, F16 or BF16) transposed, in a copy appended to `storage`: Gemma 3's
/// projection is stored for x @ W, the kernels want one row per output.
WeightView transposed_copy(const WeightView& w, std::vector<std::shared_ptr<const void>>* storage);

}  // namespace troupe::model::detail
