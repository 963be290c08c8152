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

namespace ptool {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation

[[noreturn]] void bad(const std::string& file, const std::string& msg) {
    throw InputError(SourceLocation{file, 0, 0}, msg);
}

// The temporary file being written, removed if SIGINT or SIGTERM arrives meanwhile: an
// interrupted write leaves the old file and nothing else. SIGKILL cannot be caught: the temp
// file (named after the writer's pid) then stays until the next write to the same path removes
// the temp files of writers that no longer exist. The target is never partial either way.
char g_pending_tmp[4096];
volatile sig_atomic_t g_pending = 0;

void remove_pending_and_reraise(int sig) {
    if (g_pending) unlink(g_pending_tmp);  // async-signal-safe
    signal(sig, SIG_DFL);
    raise(sig);
}

void track_tmp(const std::string& path) {
    static const bool installed = [] {
        for (int sig : {SIGINT, SIGTERM}) {
            struct sigaction sa {};
            sa.sa_handler = remove_pending_and_reraise;
            sigaction(sig, &sa, nullptr);
        }
        return true;
    }();
    (void)installed;
    g_pending = 0;
    if (path.size() < sizeof g_pending_tmp) {
        std::memcpy(g_pending_tmp, path.c_str(), path.size() + 1);
        g_pending = 1;
    }
}

void untrack_tmp() { g_pending = 0; }

}  // namespace

const Tensor* TensorFile::find(const std::string& name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return &t;
    return nullptr;
}

TensorFile parse_safetensors(const std::string& bytes, const std::string& name) {
    if (bytes.size() < 8) bad(name, fmt::format("not a safetensors file: {} bytes, shorter than the 8-byte header length", bytes.size()));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
    if (hlen > kMaxHeader) bad(name, fmt::format("header length {} is over the limit of {}", hlen, kMaxHeader));
    if (hlen > bytes.size() - 8)
        bad(name, fmt::format("header length {} runs past the end of the file ({} bytes)", hlen, bytes.size()));
    const uint64_t data_size = bytes.size() - 8 - hlen;
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(hlen));
    } catch (const nlohmann::json::exception& e) {
        bad(name, fmt::format("header is not valid JSON: {}", e.what()));
    }
    if (!header.is_object()) bad(name, "header is not a JSON object");

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
                if (!m.value().is_string()) bad(name, fmt::format("__metadata__ '{}' is not a string", m.key()));
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
        if (!v["shape"].is_array() || v["shape"].size() > 16) tbad("shape must be an array of at most 16 dims");
        Shape shape;
        uint64_t numel = 1;
        for (const auto& d : v["shape"]) {
            if (!d.is_number_unsigned()) tbad("shape entries must be non-negative integers");
            const uint64_t n = d.get<uint64_t>();
            if (n != 0 && numel > (uint64_t{1} << 50) / n) tbad("shape is too large");
            numel *= n;
            shape.push_back(static_cast<int64_t>(n));
        }
        const auto& off = v["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            tbad("data_offsets must be [begin, end]");
        const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        if (b > e || e > data_size)
            tbad(fmt::format("data_offsets [{}, {}] are outside the {} data bytes", b, e, data_size));
        if (e - b != numel * dtype_size(dt))
            tbad(fmt::format("data_offsets cover {} bytes, but {} {} needs {}", e - b, dtype_name(dt), shape_str(shape),
                             numel * dtype_size(dt)));
        ranges.push_back({b, e, key});
        Tensor t(shape, dt);
        if (numel) std::memcpy(t.raw(), bytes.data() + 8 + hlen + b, e - b);
        out.add(key, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
    uint64_t cursor = 0;
    for (const Range& r : ranges) {
        if (r.begin != cursor)
            bad(name, fmt::format("tensor '{}': data_offsets start at {}, expected {} (overlap or hole)", r.key,
                                  r.begin, cursor));
        cursor = r.end;
    }
    if (cursor != data_size) bad(name, fmt::format("{} data bytes are not covered by any tensor", data_size - cursor));
    return out;
}

TensorFile read_safetensors(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) bad(path, "no such file");
    std::ifstream in(path, std::ios::binary);
    if (!in) bad(path, "cannot open file");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_safetensors(ss.str(), path);
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

void write_file_atomic(const std::string& path, const std::string& bytes, bool overwrite) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!overwrite && fs::exists(path, ec))
        throw InputError(SourceLocation{path, 0, 0}, "file exists (use --force to replace it)");
    fs::path target(path);
    fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    // leftovers of killed writers: ".NAME.tmp-PID-XXXXXX" whose PID is gone
    const std::string prefix = "." + target.filename().string() + ".tmp-";
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
        if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
    }
    std::string tmpl = (dir / fmt::format("{}{}-XXXXXX", prefix, ::getpid())).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int fd = mkstemp(buf.data());
    if (fd < 0) throw InputError(SourceLocation{path, 0, 0}, fmt::format("cannot create a file here: {}", std::strerror(errno)));
    const std::string tmp(buf.data());
    track_tmp(tmp);
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            untrack_tmp();
            throw RuntimeError(fmt::format("{}: write failed: {}", path, std::strerror(err)));
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        ::unlink(tmp.c_str());
        untrack_tmp();
        throw RuntimeError(fmt::format("{}: flush failed: {}", path, std::strerror(errno)));
    }
    ::chmod(tmp.c_str(), 0644);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        untrack_tmp();
        throw RuntimeError(fmt::format("{}: rename failed: {}", path, std::strerror(err)));
    }
    untrack_tmp();
}

void write_safetensors(const std::string& path, const TensorFile& file, bool overwrite) {
    write_file_atomic(path, serialize_safetensors(file), overwrite);
}

}  // namespace ptool
