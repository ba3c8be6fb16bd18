// `distckpt layout`: every rank's slice of a device-matrix layout, as JSON, and with
// --picture an SVG drawing of which ranks hold which block.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "cli/helpers.h"
#include "distckpt/layout.h"

namespace distckpt::internal_cli {
namespace {

std::string list_text(const Shape& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// "0:8, 4:8": a box's ranges over the drawn dims.
std::string ranges_text(const Box& box, std::size_t dims) {
  std::string out;
  for (std::size_t d = 0; d < dims && d < box.offset.size(); ++d)
    out += (d ? ", " : "") + std::to_string(box.offset[d]) + ":" + std::to_string(box.offset[d] + box.shape[d]);
  return out;
}

// How tensor_map reads, dim by dim: the device axis counted from the right.
std::vector<std::string> tensor_map_lines(const Shape& dev_mat, const Shape& tensor_map) {
  std::vector<std::string> out;
  const int64_t n = static_cast<int64_t>(dev_mat.size());
  for (std::size_t d = 0; d < tensor_map.size(); ++d) {
    const int64_t k = tensor_map[d];
    if (k < 0) {
      out.push_back("dim " + std::to_string(d) + ": tensor_map " + std::to_string(k) + " = not split");
    } else {
      const int64_t axis = n - 1 - k;  // counted from the right: 0 is the last entry
      out.push_back("dim " + std::to_string(d) + ": tensor_map " + std::to_string(k) + " = dev_mat[" +
                    std::to_string(axis) + "] (" + std::to_string(dev_mat[static_cast<std::size_t>(axis)]) +
                    " ways; device axes are counted from the right)");
    }
  }
  return out;
}

// The blocks over dims 0 and 1 (a 1-D tensor is one row; more dims are drawn by their
// first two), one colour per distinct block, labelled with its holders and its ranges.
Status write_picture(const TensorLayout& layout, const Shape& dev_mat, const Shape& tensor_map, const std::string& path) {
  const Shape& shape = layout.global_shape();
  const std::size_t dims = std::min<std::size_t>(shape.size(), 2);
  const double rows = shape.size() >= 2 ? static_cast<double>(std::max<int64_t>(shape[0], 1)) : 1.0;
  const double cols = shape.empty() ? 1.0 : static_cast<double>(std::max<int64_t>(shape[dims == 2 ? 1 : 0], 1));
  const double width = 640, height = std::clamp(width * rows / cols, 80.0, 640.0), margin = 20;
  std::map<int64_t, std::vector<int>> holders;
  for (int rank : layout.ranks()) holders[layout.slice_index(rank)].push_back(rank);
  for (auto& [index, group] : holders) std::sort(group.begin(), group.end());
  const std::vector<std::string> notes = tensor_map_lines(dev_mat, tensor_map);
  const double caption = 24.0 * static_cast<double>(notes.size() + 1);
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width + 2 * margin << "\" height=\""
      << height + 2 * margin + caption << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  std::size_t colour = 0;
  for (const auto& [index, ranks] : holders) {
    const Box box = layout.slice_box(ranks.front());
    const auto at = [&](std::size_t d) { return d < box.offset.size() ? static_cast<double>(box.offset[d]) : 0.0; };
    const auto extent = [&](std::size_t d) { return d < box.shape.size() ? static_cast<double>(box.shape[d]) : 1.0; };
    const double x = margin + width * (dims == 2 ? at(1) : dims == 1 ? at(0) : 0) / cols;
    const double w = width * (dims == 2 ? extent(1) : dims == 1 ? extent(0) : cols) / cols;
    const double y = margin + (dims == 2 ? height * at(0) / rows : 0);
    const double h = dims == 2 ? height * extent(0) / rows : height;
    const int hue = static_cast<int>(360 * colour++ / std::max<std::size_t>(holders.size(), 1));
    std::string who;
    for (std::size_t i = 0; i < ranks.size(); ++i) who += (i ? "," : "") + std::to_string(ranks[i]);
    svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << h << "\" fill=\"hsl(" << hue
        << ",60%,80%)\" stroke=\"black\"/>\n"
        << "<text x=\"" << x + w / 2 << "\" y=\"" << y + h / 2 - 4 << "\" text-anchor=\"middle\">rank "
        << who << "</text>\n"
        << "<text x=\"" << x + w / 2 << "\" y=\"" << y + h / 2 + 12 << "\" text-anchor=\"middle\">["
        << ranges_text(box, dims) << "]</text>\n";
  }
  double line = margin + height + 24;
  svg << "<text x=\"" << margin << "\" y=\"" << line << "\">shape " << list_text(shape) << "   dev_mat "
      << list_text(dev_mat) << "   tensor_map " << list_text(tensor_map)
      << (shape.size() > 2 ? "   (dims 0 and 1 drawn)" : "") << "</text>\n";
  for (const std::string& note : notes) svg << "<text x=\"" << margin << "\" y=\"" << (line += 24) << "\">" << note << "</text>\n";
  svg << "</svg>\n";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << svg.str();
  out.close();
  if (!out) return io_error("layout --picture: cannot write '" + path + "'");
  return Status();
}

}  // namespace

int cmd_layout(const LayoutArgs& args) {
  auto shape = parse_list(args.shape, "--shape");
  auto dev_mat = parse_list(args.dev_mat, "--dev-mat");
  auto tensor_map = parse_list(args.tensor_map, "--tensor-map");
  auto ranks64 = parse_list(args.ranks, "--ranks");
  for (const auto* r : {&shape, &dev_mat, &tensor_map, &ranks64})
    if (!r->ok()) return fail(r->status(), 2);
  std::vector<int> ranks;
  for (int64_t r : *ranks64) {
    if (r < 0 || r > std::numeric_limits<int>::max())
      return fail(invalid_argument("--ranks: " + std::to_string(r) + " is not a valid rank"), 2);
    ranks.push_back(static_cast<int>(r));
  }
  auto layout = TensorLayout::from_device_matrix(*shape, *dev_mat, *tensor_map, ranks);
  if (!layout.ok()) return fail(layout.status(), 2);
  // One line per rank, each listing its replicas: the output grows with the square of
  // the group, so very large groups are refused rather than printed for minutes.
  constexpr int kMaxPrintedRanks = 1 << 16;
  if (layout->group_size() > kMaxPrintedRanks)
    return fail(invalid_argument("layout: a group of " + std::to_string(layout->group_size()) +
                                 " ranks is too large to print (at most " + std::to_string(kMaxPrintedRanks) + ")"),
                2);
  // Replicas are the ranks with the same slice index: group once instead of per rank.
  std::map<int64_t, std::vector<int>> holders;
  for (int rank : layout->ranks()) holders[layout->slice_index(rank)].push_back(rank);
  for (auto& [index, group] : holders) std::sort(group.begin(), group.end());
  json slices = json::array();
  for (int rank : layout->ranks()) {
    const Box box = layout->slice_box(rank);
    slices.push_back({{"rank", rank},
                      {"offset", box.offset},
                      {"shape", box.shape},
                      {"slice_index", layout->slice_index(rank)},
                      {"replicas", holders[layout->slice_index(rank)]}});
  }
  std::cout << dump(json{{"slices", slices}}) << "\n";
  if (!args.picture.empty())
    if (Status st = write_picture(*layout, *dev_mat, *tensor_map, args.picture); !st.ok()) return fail(st);
  return 0;
}

}  // namespace distckpt::internal_cli
