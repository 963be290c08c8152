#include "comm_conformance.h"

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "parallel/device_mesh.h"

using namespace ptool;

RanksConformance run_conformance_on_ranks(const std::function<void(const RankFn&)>& launch,
                                          ptool::Device device) {
    std::mutex mu;
    RanksConformance all;
    launch([&](ptool::Communicator& comm) {
        ConformanceReport mine;
        run_comm_conformance(comm, mine, device);
        std::lock_guard lock(mu);
        all.report.passed += mine.passed, all.report.failed += mine.failed;
        all.report.failures.insert(all.report.failures.end(), mine.failures.begin(), mine.failures.end());
        all.backend = comm.backend();
    });
    return all;
}

void ConformanceReport::expect(bool ok, const std::string& what) {
    if (ok) {
        ++passed;
    } else {
        ++failed;
        if (failures.size() < 20) failures.push_back(what);
    }
}

namespace {

const DType kDtypes[] = {DType::float32, DType::float64, DType::bfloat16, DType::float16};
thread_local Device g_device =
    Device::cpu;  // per rank thread: where the collectives' tensors live (cuda: the cuda_local communicator)

Tensor on_device(const Tensor& host) {
    return g_device == Device::cpu ? host : host.to_device(g_device);
}

// Rank r's element i: small integers (exact sums in every dtype) or N(0, 1) draws.
double value(int rank, int64_t i, bool integer, uint64_t salt) {
    if (integer) return static_cast<double>(((rank * 7 + i * 3 + static_cast<int64_t>(salt)) % 11) - 5);
    return CounterRng(salt, static_cast<uint64_t>(rank)).normal(static_cast<uint64_t>(i));
}

Tensor rank_tensor(int rank, Shape shape, DType dt, bool integer, uint64_t salt) {
    Tensor t(shape, dt);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value(rank, i, integer, salt));
    return on_device(t);
}

// The serial computation: element by element, ranks in order, in the dtype's accumulate type.
double serial_reduce(int n, int64_t i, DType dt, ReduceOp op, bool integer, uint64_t salt) {
    return dispatch_float(dt, [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        A acc = A(T(static_cast<A>(value(0, i, integer, salt))));
        for (int r = 1; r < n; ++r) {
            const A v = A(T(static_cast<A>(value(r, i, integer, salt))));
            acc = op == ReduceOp::max ? std::max(acc, v) : acc + v;
        }
        if (op == ReduceOp::avg) acc /= A(n);
        return static_cast<double>(A(T(acc)));
    });
}

std::string tag(const char* op, DType dt, int64_t n) {
    return fmt::format("{} {} numel {}", op, dtype_name(dt), n);
}

void check_all_reduce(Communicator& c, ConformanceReport& rep) {
    for (DType dt : kDtypes)
        for (int64_t n : {1, 7, 1000, 4097})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
                for (bool integer : {true, false}) {
                    Tensor t = rank_tensor(c.rank(), {n}, dt, integer, 11);
                    c.all_reduce(t, op);
                    bool ok = true;
                    for (int64_t i = 0; i < n && ok; ++i)
                        ok = t.item(i) == serial_reduce(c.size(), i, dt, op, integer, 11);
                    rep.expect(ok, tag("all_reduce", dt, n) + " " + reduce_op_name(op) +
                                       (integer ? " ints" : " normals") +
                                       " differs from the serial rank-order reduction");
                }
}

void check_all_gather(Communicator& c, ConformanceReport& rep) {
    for (DType dt : kDtypes)
        for (int64_t rows : {int64_t(c.size()) * 2, int64_t(7), int64_t(1)}) {  // even, uneven, mostly empty
            const Chunk mine = chunk_of(rows, c.size(), c.rank());
            Tensor full = rank_tensor(0, {rows, 3}, dt, false, 5);  // every rank holds a torch.chunk of it
            Tensor in = full.narrow(0, mine.offset, mine.length).clone();
            Tensor out({rows, 3}, dt, g_device);
            c.all_gather(in, out);
            rep.expect(out.to_doubles() == full.to_doubles(),
                       tag("all_gather", dt, rows * 3) + " chunks do not reassemble");
        }
}

void check_reduce_scatter(Communicator& c, ConformanceReport& rep) {
    for (DType dt : kDtypes)
        for (int64_t rows : {int64_t(c.size()) * 2, int64_t(7)})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
                Tensor in = rank_tensor(c.rank(), {rows, 2}, dt, false, 13);
                const Chunk mine = chunk_of(rows, c.size(), c.rank());
                Tensor out({mine.length, 2}, dt, g_device);
                c.reduce_scatter(in, out, op);
                bool ok = true;
                for (int64_t i = 0; i < out.numel() && ok; ++i)
                    ok = out.item(i) == serial_reduce(c.size(), mine.offset * 2 + i, dt, op, false, 13);
                rep.expect(
                    ok, tag("reduce_scatter", dt, rows * 2) + " " + reduce_op_name(op) + " chunk is wrong");
            }
}

void check_broadcast_all_to_all(Communicator& c, ConformanceReport& rep) {
    for (DType dt : kDtypes)
        for (int root = 0; root < c.size(); ++root) {
            Tensor t = rank_tensor(c.rank(), {5, 3}, dt, false, 17);
            c.broadcast(t, root);
            rep.expect(t.to_doubles() == rank_tensor(root, {5, 3}, dt, false, 17).to_doubles(),
                       tag("broadcast", dt, 15) + fmt::format(" from root {}", root));
        }
    for (DType dt : kDtypes) {
        const int n = c.size();
        Tensor host({n * 2, 3}, dt), out({n * 2, 3}, dt, g_device);
        // chunk j goes to rank j; values stay below 256, exact in bf16
        for (int64_t i = 0; i < host.numel(); ++i) host.set(i, (c.rank() * 100 + i) % 251);
        Tensor in = on_device(host);
        c.all_to_all(in, out);
        bool ok = true;
        for (int src = 0; src < n; ++src)
            for (int64_t k = 0; k < 6; ++k)
                ok = ok && out.item(src * 6 + k) == (src * 100 + c.rank() * 6 + k) % 251;
        rep.expect(ok, tag("all_to_all", dt, n * 6));
    }
    c.barrier();
    rep.expect(true, "barrier");
}

// Rank src sends (src + dst) % 3 rows to rank dst (0 to 2, some none); element c of row k of that
// block is (src * 7 + dst * 3 + k) * 3 + c, below 256 (exact in bf16).
double a2av_value(int src, int dst, int64_t k, int64_t c) {
    return static_cast<double>(((src * 7 + dst * 3 + k) * 3 + c) % 251);
}

void check_all_to_all_v(Communicator& c, ConformanceReport& rep) {
    const int n = c.size(), me = c.rank();
    std::vector<int64_t> send(n), recv(n);
    int64_t rows_in = 0, rows_out = 0;
    for (int j = 0; j < n; ++j)
        send[j] = (me + j) % 3, recv[j] = (j + me) % 3, rows_in += send[j], rows_out += recv[j];
    for (DType dt : kDtypes) {
        Tensor host({rows_in, 3}, dt), out({rows_out, 3}, dt, g_device);
        int64_t row = 0;
        for (int j = 0; j < n; ++j)
            for (int64_t k = 0; k < send[j]; ++k, ++row)
                for (int64_t col = 0; col < 3; ++col) host.set(row * 3 + col, a2av_value(me, j, k, col));
        c.all_to_all_v(on_device(host), send, out, recv);
        bool ok = true;
        row = 0;
        for (int src = 0; src < n; ++src)
            for (int64_t k = 0; k < recv[src]; ++k, ++row)
                for (int64_t col = 0; col < 3; ++col)
                    ok = ok && out.item(row * 3 + col) == a2av_value(src, me, k, col);
        rep.expect(ok, tag("all_to_all_v", dt, rows_out * 3));
    }
}

void check_mesh(Communicator& world, ConformanceReport& rep) {
    const int n = world.size();
    std::vector<std::vector<MeshDim>> meshes = {{{"dp", n}}};
    if (n % 2 == 0 && n >= 4) meshes.push_back({{"dp", 2}, {"tp", n / 2}});
    if (n == 8) meshes.push_back({{"a", 2}, {"b", 2}, {"c", 2}});
    for (const auto& dims : meshes) {
        auto counter = std::make_shared<CommCounter>();
        DeviceMesh mesh(dims, world, counter);
        for (int d = 0; d < mesh.ndim(); ++d) {
            // sum of world ranks over my group = sum over coordinates k of rank_of(coords with dim d = k)
            Tensor t = on_device(Tensor::full({3}, DType::float64, world.rank()));
            mesh.comm(d).all_reduce(t, ReduceOp::sum);
            double expected = 0;
            std::vector<int> c = mesh.coords();
            for (int k = 0; k < dims[d].size; ++k) {
                c[d] = k;
                expected += DeviceMesh::rank_of(c, dims);
            }
            rep.expect(t.item(0) == expected && mesh.comm(d).size() == dims[d].size &&
                           mesh.comm(d).rank() == mesh.coord(d),
                       fmt::format("mesh dim '{}' of {} groups the wrong ranks", dims[d].name, dims.size()));
        }
        rep.expect(counter->entries().size() == static_cast<size_t>(mesh.ndim()),
                   "each mesh dim counts its all_reduce under its own name");
    }
}

void check_counting(Communicator& world, ConformanceReport& rep) {
    auto counter = std::make_shared<CommCounter>();
    world.set_counter(counter, "world");
    counter->set_module("net1");
    Tensor t({4, 4}, DType::float32, g_device);
    world.all_reduce(t, ReduceOp::sum);
    world.all_reduce(t, ReduceOp::sum);
    counter->set_module("net2");
    Tensor out({4 * world.size(), 4}, DType::float32, g_device);
    world.all_gather(t, out);
    auto by_op = counter->by_op();
    rep.expect(by_op[Collective::all_reduce].calls == 2 && by_op[Collective::all_reduce].bytes == 128 &&
                   by_op[Collective::all_gather].calls == 1 &&
                   by_op[Collective::all_gather].bytes == static_cast<int64_t>(out.nbytes()),
               "CommCounter counts calls and bytes per op");
    rep.expect(counter->entries().count({Collective::all_gather, "world", "net2"}) == 1,
               "CommCounter scopes by module");
    world.set_counter(nullptr, "");
}

}  // namespace

void run_comm_conformance(Communicator& world, ConformanceReport& report, Device device) {
    g_device = device;
    check_all_reduce(world, report);
    check_all_gather(world, report);
    check_reduce_scatter(world, report);
    check_broadcast_all_to_all(world, report);
    check_all_to_all_v(world, report);
    check_mesh(world, report);
    check_counting(world, report);
    check_p2p(world, report, device);
}
