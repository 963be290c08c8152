# The op-case table (op_cases.h) as a library, for the tests that drive from it (test_op_cases,
# test_cuda_backend) and for bench/bench_ops, which builds it when the tests are not built.
if(NOT TARGET ptool_op_cases)
  add_library(ptool_op_cases STATIC
              ${CMAKE_CURRENT_LIST_DIR}/op_cases.cpp ${CMAKE_CURRENT_LIST_DIR}/op_cases_gemm.cpp
              ${CMAKE_CURRENT_LIST_DIR}/op_cases_elementwise.cpp ${CMAKE_CURRENT_LIST_DIR}/op_cases_exact.cpp
              ${CMAKE_CURRENT_LIST_DIR}/op_cases_norm.cpp ${CMAKE_CURRENT_LIST_DIR}/op_cases_softmax.cpp
              ${CMAKE_CURRENT_LIST_DIR}/op_cases_attention.cpp ${CMAKE_CURRENT_LIST_DIR}/op_cases_loss_optim.cpp)
  target_link_libraries(ptool_op_cases PUBLIC ptool_engine)
  target_include_directories(ptool_op_cases PUBLIC ${CMAKE_CURRENT_LIST_DIR})
endif()
