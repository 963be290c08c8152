#include "core/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/files.h"
#include "core/json_reader.h"

namespace ptool {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation
constexpr int kMaxHeaderDepth = 8;
constexpr uint64_t kMaxFileBytes = uint64_t{1}
                                   << 40;  // 1 TiB: a regular file's size is checked before it is read
// A pipe has no size to check: it is refused once it sends more than this (save a larger one to a file)
constexpr uint64_t kMaxStreamBytes = uint64_t{1} << 30;

[[noreturn]] void bad(const std::string& file, const std::string& msg) {
    throw InputError(SourceLocation{file, 0, 0}, msg);
}

}  // namespace

const Tensor* TensorFile::find(const std::string& name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return &t;
    return nullptr;
}

TensorFile parse_safetensors(const std::string& bytes, const std::string& name) {
    if (bytes.size() < 8)
        bad(name, fmt::format("not a safetensors file: {} bytes, shorter than the 8-byte header length",
                              bytes.size()));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
    if (hlen > kMaxHeader)
        bad(name, fmt::format("header length {} is over the limit of {}", hlen, kMaxHeader));
    if (hlen > bytes.size() - 8)
        bad(name,
            fmt::format("header length {} runs past the end of the file ({} bytes)", hlen, bytes.size()));
    const uint64_t data_size = bytes.size() - 8 - hlen;
    // a header nests 3 deep (its entries' shapes): deeper is refused before the parser recurses on
    // it (100 MB of '[' took 7 GB of memory)
    check_depth(bytes.substr(8, hlen), name, kMaxHeaderDepth);
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(hlen));
    } catch (const nlohmann::json::exception& e) {
        bad(name, fmt::format("header is not valid JSON: {}", json_error_text(e.what())));
    }
    if (!header.is_object()) bad(name, "header is not a JSON object");
    if (const auto dup = json_duplicate_key(bytes.substr(8, hlen)))  // nlohmann kept the last one
        bad(name, fmt::format("the header holds {} twice (which one counts is undefined)",
                              nlohmann::json(dup->second).dump()));
    // a name or metadata with a control byte would reach messages and terminals raw (an escape
    // sequence, a forged line): exit 2. Metadata values may hold tabs and line ends (a golden's
    // model and plan YAML), which YAML allows.
    auto control_byte = [](const std::string& s, bool text) -> int {
        for (const unsigned char c : s)
            if ((c < 0x20 && !(text && (c == '\n' || c == '\t' || c == '\r'))) || c == 0x7f) return c;
        return -1;
    };
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (const int c = control_byte(it.key(), false); c >= 0)
            bad(name, fmt::format("a tensor name holds the control byte 0x{:02x}", c));
        if (it.value().is_object() && it.key() != "__metadata__")  // an entry's strings (its dtype)
            for (const auto& field : it.value())
                if (field.is_string())
                    if (const int c = control_byte(field.get<std::string>(), false); c >= 0)
                        bad(name, fmt::format("a tensor entry holds the control byte 0x{:02x}", c));
        if (it.key() == "__metadata__" && it.value().is_object())
            for (auto m = it.value().begin(); m != it.value().end(); ++m)
                if (const int c = std::max(
                        control_byte(m.key(), false),
                        m.value().is_string() ? control_byte(m.value().get<std::string>(), true) : -1);
                    c >= 0)
                    bad(name, fmt::format("__metadata__ holds the control byte 0x{:02x}", c));
    }

    TensorFile out;
    struct Range {
        uint64_t begin, end;
        std::string key;
    };
    std::vector<Range> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& key = it.key();
        const nlohmann::json& v = it.value();
        if (key == "__metadata__") {
            if (!v.is_object()) bad(name, "__metadata__ must be an object of strings");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    bad(name, fmt::format("__metadata__ '{}' is not a string", m.key()));
                out.metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        auto tbad = [&](const std::string& msg) { bad(name, fmt::format("tensor '{}': {}", key, msg)); };
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
            tbad("entry must have dtype, shape and data_offsets");
        if (!v["dtype"].is_string()) tbad("dtype is not a string");
        DType dt;
        if (!parse_safetensors_dtype(v["dtype"].get<std::string>(), &dt))
            tbad(fmt::format("unsupported dtype '{}' (supported: F32, F64, BF16, F16, I64, I32)",
                             v["dtype"].get<std::string>()));
        if (!v["shape"].is_array() || v["shape"].size() > 16)
            tbad("shape must be an array of at most 16 dims");
        Shape shape;
        uint64_t numel = 1;
        for (const auto& d : v["shape"]) {
            if (!d.is_number_unsigned()) tbad("shape entries must be non-negative integers");
            const uint64_t n = d.get<uint64_t>();
            // each dim on its own too: beside a 0 dim the product stays 0, and a dim past int64 read negative
            if (n > (uint64_t{1} << 50) || (n != 0 && numel > (uint64_t{1} << 50) / n))
                tbad("shape is too large");
            numel *= n;
            shape.push_back(static_cast<int64_t>(n));
        }
        const auto& off = v["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
            !off[1].is_number_unsigned())
            tbad("data_offsets must be [begin, end]");
        const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        if (b > e || e > data_size)
            tbad(fmt::format("data_offsets [{}, {}] are outside the {} data bytes", b, e, data_size));
        if (e - b != numel * dtype_size(dt))
            tbad(fmt::format("data_offsets cover {} bytes, but {} {} needs {}", e - b, dtype_name(dt),
                             shape_str(shape), numel * dtype_size(dt)));
        ranges.push_back({b, e, key});
        Tensor t(shape, dt);
        if (numel) std::memcpy(t.raw(), bytes.data() + 8 + hlen + b, e - b);
        out.add(key, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
    uint64_t cursor = 0;
    for (const Range& r : ranges) {
        if (r.begin != cursor)
            bad(name, fmt::format("tensor '{}': data_offsets start at {}, expected {} (overlap or hole)",
                                  r.key, r.begin, cursor));
        cursor = r.end;
    }
    if (cursor != data_size)
        bad(name, fmt::format("{} data bytes are not covered by any tensor", data_size - cursor));
    return out;
}

std::map<std::string, std::string> peek_safetensors_metadata(const std::string& path) {
    std::map<std::string, std::string> out;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return out;
    struct stat st {};
    unsigned char len[8];
    std::string header;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::pread(fd, len, 8, 0) == 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
        if (n <= kMaxHeader && n <= static_cast<uint64_t>(st.st_size) - 8) {
            header.resize(n);
            if (::pread(fd, header.data(), n, 8) != static_cast<ssize_t>(n)) header.clear();
        }
    }
    ::close(fd);
    const nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
    if (!h.is_object() || !h.contains("__metadata__") || !h["__metadata__"].is_object()) return out;
    for (const auto& [key, value] : h["__metadata__"].items())
        if (value.is_string()) out[key] = value.get<std::string>();
    return out;
}

TensorFile read_safetensors(const std::string& path) {
    return parse_safetensors(read_file(path, kMaxFileBytes, kMaxStreamBytes), path);
}

std::string serialize_safetensors(const TensorFile& file) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
    uint64_t offset = 0;
    for (const auto& [name, t] : file.tensors) {
        PTOOL_REQUIRE(t.device() == Device::cpu, "serialize '{}': tensors must be on the host", name);
        header[name] = {{"dtype", dtype_safetensors_name(t.dtype())},
                        {"shape", t.shape()},
                        {"data_offsets", {offset, offset + t.nbytes()}}};
        offset += t.nbytes();
    }
    std::string h = header.dump();
    while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data, as the reference writer does
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    out += h;
    out.reserve(out.size() + offset);
    for (const auto& [name, t] : file.tensors) out.append(static_cast<const char*>(t.raw()), t.nbytes());
    return out;
}

void write_safetensors(const std::string& path, const TensorFile& file, bool overwrite) {
    write_file(path, serialize_safetensors(file), overwrite);
}

}  // namespace ptool
